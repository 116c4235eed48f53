"""The agent of one node in a run of several nodes (``rankguard run --nnodes N ...``).

It is the one-node launcher (``agent.Launcher``: ranks, ledgers, hang rules, teardown, spares,
journal) with three things added per attempt:

1. **join** a round of torch's rendezvous (``rendezvous``): this node's rank among the nodes,
   its ranks' global numbers, the round's number. The ranks get torchrun's multi-node
   environment; their store is the job's store at ``--rdzv-endpoint``, under the round's own
   prefix; every journal event of the round carries ``round``.
2. **learn** that the round ended elsewhere (``round_end``): a fault on another node stops this
   node's ranks the same way as a local one (stacks, SIGTERM, SIGKILL after ``--grace``), and
   the next round starts on every node, or the job ends with the same root cause and exit code
   on every node.
3. **tell** the other nodes: this node's first fault ends the round for all; a node whose ranks
   all ended well counts itself done and waits (up to ``join_timeout``) for the others.

After the last attempt every agent closes the rendezvous and counts itself out of the job; the
agent that hosts the store waits (up to ``close_timeout``) until the others have, so that none
loses the store while it still needs it.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from typing import Any

from ..deadline import Deadline
from ..errors import RendezvousError, UsageError
from .agent import Launcher, _Attempt
from .config import RunConfig
from .monitor import Verdict
from .outcome import Fault
from .ranks import Layout
from .rendezvous import Rendezvous, agents_namespace, connect, round_namespace
from .round_end import RoundChannel, RoundEnd
from .summary import AttemptReport
from .. import margins


def left_to_another_node(verdict: Verdict, local: set[int], nodes: int,
                         hang_timeout: float) -> bool:
    """Whether this node leaves ``verdict`` to another node's agent for now. An agent sees only
    its own ranks (``local``): when they all entered a collective of a group spanning nodes
    that never completed, the rank that did not arrive is most likely on another node, whose
    agent blames it ``hang_timeout`` after its peers began to wait. So such a verdict
    (``stuck_in_collective``) stands here only once it has waited twice as long. Pure."""
    if not verdict.hung or verdict.reason != "stuck_in_collective":
        return False
    if verdict.group == "world":
        spans = nodes > 1
    else:  # "ranks 0,2"
        spans = not {int(r) for r in verdict.group.split(" ", 1)[1].split(",")} <= local
    return spans and verdict.waited_s < 2 * hang_timeout


class _Interrupted(Exception):
    """The agent received SIGINT or SIGTERM while it waited in the rendezvous."""


class NodeAgent(Launcher):
    """One node's agent; ``run()`` returns its exit code (the same on every node for the
    job's outcome)."""

    def __init__(self, config: RunConfig, store: Any, hosting: bool) -> None:
        super().__init__(config, None)
        assert config.rendezvous is not None
        self._rdzv_cfg = config.rendezvous
        self._store = store  # the job's store: the launcher hosts no other
        self._hosting = hosting
        self._rdzv = Rendezvous(config.rendezvous, config.run_id, store)
        self._channel: RoundChannel | None = None
        self._group_rank = -1
        self._group_world = 0
        self._local_ranks: set[int] = set()
        self._in_rendezvous = False
        self._outside: Fault | None = None  # the fault another node ended this round with
        self._cascade_window = margins.NODE_CASCADE_WINDOW_S

    def _run_fields(self) -> dict[str, Any]:
        cfg = self._rdzv_cfg
        return {"nnodes": f"{cfg.min_nodes}:{cfg.max_nodes}", "rdzv_backend": cfg.backend,
                "rdzv_endpoint": cfg.endpoint, "store_host": self._hosting}

    # -- each attempt ----------------------------------------------------------------------------

    def _run_attempt(self, attempt: int) -> _Attempt:
        try:
            return super()._run_attempt(attempt)
        except (RendezvousError, _Interrupted) as exc:
            now = time.monotonic()
            if isinstance(exc, _Interrupted):
                fault = Fault("launcher_signal", now, None, str(exc))
            else:
                fault = Fault("rendezvous", now, None, str(exc))
            self._say(f"rankguard: {fault.describe()}")
            result = _Attempt(fault=fault)
            result.report = AttemptReport(attempt, [], fault.describe())
            return result

    def _join(self, attempt: int) -> Layout:
        cfg = self._rdzv_cfg
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        self._outside = None
        self._in_rendezvous = True
        try:
            if self._signal is not None:
                raise _Interrupted("the agent was stopped before the round formed")
            joined = self._rdzv.next_round(self.config.nproc)
        finally:
            self._in_rendezvous = False
        self._group_rank, self._group_world = joined.group_rank, joined.group_world
        self._local_ranks = set(range(joined.base, joined.base + self.config.nproc))
        self._journal.context(round=joined.number)
        self._journal.write("rendezvous", attempt=attempt, group_rank=joined.group_rank,
                            group_world_size=joined.group_world, base_rank=joined.base,
                            world_size=joined.world, endpoint=cfg.endpoint)
        last = joined.base + self.config.nproc - 1
        self._say(f"rankguard: round {joined.number}: node {joined.group_rank} of "
                  f"{joined.group_world}, ranks {joined.base} to {last} of {joined.world}")
        self._channel = RoundChannel(
            self._store, self._connect, agents_namespace(self.config.run_id, joined.number),
            joined.group_world, cfg.endpoint, self._poke)
        return Layout(cfg.host, cfg.port, round_namespace(self.config.run_id, joined.number),
                      joined.world, joined.base, joined.group_rank, joined.group_world,
                      joined.number)

    def _outside_fault(self, now: float) -> Fault | None:
        end = self._channel.end if self._channel is not None else None
        if end is None or end.ok or end.node == self._group_rank:
            return None
        self._outside = end.fault(now)
        return self._outside

    def _on_verdict(self, verdict: Verdict, result: _Attempt, now: float) -> None:
        if not left_to_another_node(verdict, self._local_ranks, self._group_world,
                                    self.config.hang_timeout):
            super()._on_verdict(verdict, result, now)

    def _settle(self, result: _Attempt) -> None:
        channel = self._channel
        assert channel is not None
        try:
            self._settle_with(channel, result)
        except RuntimeError as exc:  # the store failed under a request of ours
            result.fault = Fault("store_lost", time.monotonic(), None,
                                 f"lost the job's store at {self._rdzv_cfg.endpoint}: "
                                 f"{str(exc).strip().splitlines()[0] if str(exc) else exc!r}")
            self._say(f"rankguard: {result.fault.describe()}")
        end = channel.end
        self._journal.write("round_end", ok=result.fault is None,
                            node=end.node if end is not None else None,
                            rank=end.rank if end is not None else None,
                            root_cause=end.describe() if end is not None and not end.ok else None)

    def _settle_with(self, channel: RoundChannel, result: _Attempt) -> None:
        node = self._group_rank
        fault = result.fault
        if fault is not None:
            if fault is not self._outside:  # this node's own: end the round with it
                self._end_round(channel.publish(RoundEnd.of(fault, node)))
            return
        channel.done()
        end = channel.wait(Deadline.after(self._rdzv_cfg.join_timeout))
        now = time.monotonic()
        if self._signal is not None:
            result.fault = Fault("launcher_signal", now, None, "the agent received a signal")
            channel.publish(RoundEnd.of(result.fault, node))
        elif end is None:
            result.fault = Fault("gave_up", now, None, "this node's ranks ended well, but the "
                                 "other nodes' did not end within join_timeout "
                                 f"{self._rdzv_cfg.join_timeout} s")
            self._say(f"rankguard: {result.fault.describe()}")
            channel.publish(RoundEnd.of(result.fault, node))
        elif not end.ok:
            result.fault = end.fault(now)
            self._say(f"rankguard: {result.fault.describe()}")

    def _end_round(self, standing: RoundEnd) -> None:
        """Our fault was published; if another node's stood first (the two met), the job's
        root cause is that one: keep ours for this node's journal, say the other."""
        if standing.node != self._group_rank and not standing.ok:
            self._say(f"rankguard: the round had already ended on node {standing.node}: "
                      f"{standing.describe()}")

    # -- the end of the job ------------------------------------------------------------------------

    def _leave(self) -> None:
        if self._channel is not None:
            self._channel.close()
        cfg = self._rdzv_cfg
        self._rdzv.shutdown()
        if not self._group_world:  # never in a round: no node counts on this one
            return
        key = f"/rankguard/{self.config.run_id}/left"
        try:
            if self._store.add(key, 1) >= self._group_world:
                self._store.set(key + ".all", "1")
            if self._hosting:
                self._store.wait([key + ".all"], timedelta(seconds=cfg.close_timeout))
        except RuntimeError:
            if self._hosting:
                self._say(f"rankguard: not every node left the job within close_timeout "
                          f"{cfg.close_timeout} s; closing the store at {cfg.endpoint} anyway")

    # -- plumbing ------------------------------------------------------------------------------

    def _connect(self) -> Any:
        """Another client of the job's store (the round watcher's)."""
        from torch.distributed import TCPStore

        cfg = self._rdzv_cfg
        return TCPStore(cfg.host, cfg.port, is_master=False,
                        timeout=timedelta(seconds=cfg.read_timeout))

    def _poke(self) -> None:
        """Wake the attempt's event loop (from the watcher's thread)."""
        try:
            os.write(self._wakeup_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # full: it is awake already

    def _on_signal(self, signum: int) -> None:
        super()._on_signal(signum)
        if self._channel is not None:
            self._channel.interrupt()
        if self._in_rendezvous:
            self._in_rendezvous = False
            raise _Interrupted("the agent received a signal while it waited for the round")


def main(config: RunConfig) -> int:
    """Run this node's agent; returns its exit code (2, one line on stderr, when the job's
    store cannot be reached or hosted)."""
    assert config.rendezvous is not None
    try:
        store, hosting = connect(config.rendezvous)
    except UsageError as exc:
        print(f"rankguard run: error: {exc}", file=sys.stderr)
        return 2
    return NodeAgent(config, store, hosting).run()
