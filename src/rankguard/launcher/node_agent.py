"""The agent of one node in a run of several nodes (``rankguard run --nnodes N ...``).

``MultiNode`` is the node link (``node_link.NodeLink``) the launcher's agent (``agent.Agent``:
ranks, ledgers, hang rules, teardown, spares, journal) holds on several nodes. It adds, per
attempt:

1. **join** a round of torch's rendezvous (``rendezvous``): this node's rank among the nodes,
   its ranks' global numbers, the round's number. The ranks get torchrun's multi-node
   environment; their store is the job's store at ``--rdzv-endpoint``, under the round's own
   prefix; every journal event of the round carries ``round``.
2. **learn** that the round ended elsewhere (``round_end``): a fault on another node stops this
   node's ranks the same way as a local one (stacks, SIGTERM, SIGKILL after ``--grace``), and
   the next round starts on every node, or the job ends with the same root cause and exit code
   on every node.
3. **tell** the other nodes: this node's first fault ends the round for all; a node whose ranks
   all ended well counts itself done and waits for the others as long as they are heard.
4. **hear** the other nodes (``node_beats``): a node (or the store) silent for
   ``--hang-timeout`` is lost; the first agent to see it ends the round naming it, and the next
   round forms without it, if the rendezvous admits that many nodes.

After the last attempt every agent closes the rendezvous and counts itself out of the job; the
agent that hosts the store waits (up to ``close_timeout``) until the others have, so that none
loses the store while it still needs it.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from ..deadline import Deadline
from ..errors import RendezvousError, first_line
from ..records import ledger as _ledger
from ..records.ledger import RankProgress
from ..supervisor import RankProcesses
from ..inputs.options import remove_empty_dirs
from ..store.store_calls import StoreStalled, within
from .agent import Agent
from .config import RendezvousConfig, RunConfig, endpoint
from .monitor import Verdict
from . import early_signals, node_takeover
from .node_beats import NodeBeats, Silence
from .node_link import LinkContext
from .outcome import Fault, FaultKind, remote_departure, run_status
from .watch_rules import LATER, Later
from .ranks import Layout, recovery_path
from .rendezvous import JobStore, NodesMissing, Rendezvous, RendezvousClosed, Round, connect
from .store_keys import agents_key, agents_namespace, left_key, round_namespace, rounds_key
from .remote_progress import RemoteProgress
from .round_end import RoundChannel, RoundEnd, end_key
from .. import margins
from ..records.beats import beat_async, beat_entry, beat_left
from ..records.ledger_ring import wall_offset


def left_to_another_node(verdict: Verdict, local: set[int], nodes: int,
                         hang_timeout: float) -> bool:
    """Whether this node leaves ``verdict`` to another node's agent (for now). Pure.

    - A verdict that blames only other nodes' ranks (``local``: this node's) is theirs to
      make: their agent sees what those processes are doing, and names them ``hang_timeout``
      after the waiting began. A straggler report is never made here; a hang stands here only
      once it has waited twice as long (their agent is not judging: bounded all the same).
    - When this node's ranks all entered a collective of a group spanning nodes that never
      completed (``stuck_in_collective``), the rank that holds it up is most likely on another
      node: the same two hang timeouts apply.
    - So too when every rank blamed waits in a collective of another group, or in an earlier
      one of the same group that the others got past (``elsewhere``; gloo's ring completes on
      some ranks before others): what holds that one up may be on another node, whose agent
      names it within one hang timeout (it sees the waiters through the beats), or the whole
      node may have gone silent (named after one hang timeout too); when it is on this node,
      this node's verdict on that group comes first. Not when the ranks blamed are stopped
      (SIGSTOP): a stopped process waits for nothing, so nothing elsewhere holds it up.
    """
    if verdict.blamed and not set(verdict.blamed) & local:
        return not verdict.hung or verdict.waited_s < 2 * hang_timeout
    waiting_elsewhere = {rank for rank, _ in verdict.elsewhere}
    if (nodes > 1 and verdict.hung and verdict.blamed and verdict.reason != "stopped"
            and set(verdict.blamed) <= waiting_elsewhere):
        return verdict.waited_s < 2 * hang_timeout
    if not verdict.hung or verdict.reason != "stuck_in_collective":
        return False
    spans = nodes > 1 if not verdict.members else not set(verdict.members) <= local
    return spans and verdict.waited_s < 2 * hang_timeout


_CRASH_EVIDENCE_BEATS = 2  # beats a live node publishes while we decide it is gone
# the shortest gap between two looks of the agent's loop (each tick) that counts as the agent
# itself having been stopped, whatever --hang-timeout is: well over one tick (``margins.TICK_S``)
_OWN_STOP_FLOOR_S = 2.0


def beat_period(hang_timeout: float) -> float:
    """Seconds between a node's beats: an eighth of the hang timeout (a node is called silent
    after a whole one), between ``margins.TICK_S`` and 1 s."""
    return min(1.0, max(margins.TICK_S, hang_timeout / 8))


class _Interrupted(Exception):
    """The agent received SIGINT or SIGTERM while it waited in the rendezvous."""


class MultiNode:
    """One node's link to the others of its job (``node_link.NodeLink``): the launcher that
    holds it ends with the same exit code on every node for the job's outcome."""

    cascade_window = margins.NODE_CASCADE_WINDOW_S

    def __init__(self, context: LinkContext, job: JobStore) -> None:
        config = context.config
        assert config.rendezvous is not None
        self._config = config
        self._journal = context.journal
        self._say = context.say
        self._signal_received = context.signal_received
        self._spares = context.spares
        self._in_place = context.in_place
        self._wake = context.wake
        self._rdzv_cfg = config.rendezvous
        self._job = job
        self._store = job.store  # the job's store: the launcher hosts no other
        self._hosting = job.hosting  # hosts the store the others read last (c10d: the job's)
        self._rdzv = Rendezvous(config.rendezvous, config.run_id, job, config.hang_timeout)
        self._round_store = job.store  # the round's traffic: the job's store, or node 0's
        self._round_addr = (config.rendezvous.host, config.rendezvous.port)
        self._round_host_lost = False  # the round's store host (etcd-v2: node 0) is lost
        self._channel: RoundChannel | None = None
        self._beats: NodeBeats | None = None
        self._store_lost = False  # a store that failed or went silent is not asked again
        self._lost_nodes = 0  # nodes this agent saw lost, in every round it took part in
        self._counted = False  # in the job's count of agents
        self._progress: list[list[int]] = []  # the ranks' progress, for this node's beats
        self._asynchronous: list[list[int]] = []  # and their asynchronous groups
        self._left: list[list[int]] = []  # and the ones that left with code 0
        self._snaps: dict[int, RankProgress] = {}  # the ranks' ledgers, last read
        self._remote: RemoteProgress | None = None  # the other nodes' ranks, from their beats
        self._job_end: tuple[str, int] | None = None  # a standby's view of the job's end
        self._group_rank = -1
        self._group_world = 0
        self._local_ranks: set[int] = set()
        self._joined = threading.Event()  # torch's rendezvous returned, or a signal came
        self._in_rendezvous = threading.Event()  # its call runs (on the helper thread)
        self._layout: Layout | None = None  # this attempt's
        self._outside: Fault | None = None  # the fault another node ended this round with
        self._beat_period = beat_period(config.hang_timeout)
        self._last_look: float | None = None  # when _silent_fault last looked (monotonic)
        self._takeover: node_takeover.Takeover | None = None  # the lost node this one replaces
        self._awaited: dict[int, tuple[Deadline, float]] = {}  # lost nodes being taken over
        self._ranks: RankProcesses | None = None  # this attempt's, for notices

    def run_fields(self) -> dict[str, Any]:
        cfg = self._rdzv_cfg
        return {"nnodes": f"{cfg.min_nodes}:{cfg.max_nodes}", "rdzv_backend": cfg.backend,
                "rdzv_endpoint": cfg.endpoint, "store_host": self._hosting}

    # -- each attempt ----------------------------------------------------------------------------

    def join(self, attempt: int) -> Layout | Fault:
        try:
            self._layout = self._join(attempt)
            return self._layout
        except (RendezvousError, _Interrupted) as exc:
            now = time.monotonic()
            if isinstance(exc, RendezvousClosed) and not self._group_world:
                return self._stood_by(now)
            if isinstance(exc, _Interrupted):
                return Fault(FaultKind.LAUNCHER_SIGNAL, now, None, str(exc))
            if isinstance(exc, NodesMissing):  # lost as the round formed: the next one may form
                return Fault(FaultKind.NODE_LOST, now, None, str(exc))
            return Fault(FaultKind.RENDEZVOUS, now, None, str(exc))

    def _warm_up(self) -> None:
        """Start the warm spares before the first round (when restarts are allowed): a standby
        node's ranks are then ready, torch imported, when a fault calls it in; a node of the
        first round starts its ranks from them (they load while the round forms)."""
        if self._spares is not None:
            started = self._spares.fill()
            self._journal.write("spares", attempt=0, started=started, pids=self._spares.pids())

    def final(self, fault: Fault) -> bool:
        """With a static rendezvous every node must be in every round: a node lost or gone
        ends the job (its next round could never fill)."""
        return self._rdzv_cfg.backend == "static" and fault.kind in (FaultKind.NODE_LOST,
                                                                     FaultKind.NODE_LEFT)

    def _count_in(self) -> None:
        """Count this agent into the job, unless the job has ended already.

        Raises:
            RendezvousError: the store failed; or a job of this ``--rdzv-id`` ended in it
                before this agent came (an id used again: with etcd the store outlives jobs).
        """
        cfg = self._rdzv_cfg
        ended = self._rdzv.recorded_end()
        if ended is not None:
            raise RendezvousError(cfg.endpoint, f"a job with --rdzv-id {self._config.run_id} "
                                  f"has ended already in the store at {cfg.endpoint} "
                                  f"({ended[0]}, exit code {ended[1]}): give each job a new "
                                  "--rdzv-id")
        try:
            self._store.add(self._agents_key, 1)
        except RuntimeError as exc:
            raise RendezvousError(cfg.endpoint, self._store_failure(exc)) from None
        self._counted = True

    def _stood_by(self, now: float) -> Fault:
        """The rendezvous closed before this node took part in any round: it was a standby
        (a hot spare) and the job is over. It ends with the job's exit code."""
        ended = self._rdzv.recorded_end()
        self._job_end = ended
        how = f"{ended[0]}, exit code {ended[1]}" if ended is not None else "how is not known"
        return Fault(FaultKind.STANDBY_END, now, None, f"the job ended ({how}) while this node stood "
                     "by; it leaves without having run")

    def _say_waiting_for_nodes(self, cfg: RendezvousConfig) -> None:
        """Say what the next round waits for, and how long at most (after a lost node it would
        wait silently otherwise)."""
        self._say(f"rankguard: {cfg.next_round_wait}")

    def run_status(self, fault: Fault | None, signum: int | None) -> tuple[str, int]:
        if fault is not None and fault.kind == FaultKind.STANDBY_END:
            return ("was a standby", self._job_end[1] if self._job_end is not None else 0)
        return run_status(fault, signum)

    def _join(self, attempt: int) -> Layout:
        cfg = self._rdzv_cfg
        self._close_round()
        self._outside = None
        self._takeover = None
        self._awaited.clear()
        if self._signal_received() is not None:
            raise _Interrupted("the agent was stopped before the round formed")
        if not self._counted:
            self._count_in()
            self._warm_up()
            self._takeover = self._stand_by_in_place()
        if self._takeover is None and attempt > 0:
            self._say_waiting_for_nodes(cfg)
        joined = self._took_over(self._takeover) if self._takeover is not None else \
            self._next_round()
        self._group_rank, self._group_world = joined.group_rank, joined.group_world
        self._use_round_store(joined)
        self._local_ranks = set(range(joined.base, joined.base + self._config.nproc))
        self._journal.context(round=joined.number)
        self._journal.write("rendezvous", attempt=attempt, group_rank=joined.group_rank,
                            group_world_size=joined.group_world, base_rank=joined.base,
                            world_size=joined.world, endpoint=cfg.endpoint,
                            beats={"store": endpoint(*self._round_addr),
                                   "prefix": agents_namespace(self._config.run_id, joined.number),
                                   "nodes": joined.group_world})
        last = joined.base + self._config.nproc - 1
        self._say(f"rankguard: round {joined.number}: node {joined.group_rank} of "
                  f"{joined.group_world}, ranks {joined.base} to {last} of {joined.world}")
        self._last_look = None  # a new round: the wait in the rendezvous is no gap
        self._channel = RoundChannel(
            self._round_store, self._connect, agents_namespace(self._config.run_id, joined.number),
            joined.group_world, self._store_name, self._wake, cfg.read_timeout)
        self._remote = RemoteProgress(joined.world, self._local_ranks)
        self._beats = NodeBeats(self._connect, agents_namespace(self._config.run_id, joined.number),
                                joined.group_rank, joined.group_world,
                                self._beat_period,
                                cfg.local_addr or socket.gethostname(),
                                lambda: self._progress, lambda: self._asynchronous,
                                lambda: self._left)
        return Layout(joined.store_host, joined.store_port,
                      round_namespace(self._config.run_id, joined.number),
                      joined.world, joined.base, joined.group_rank, joined.group_world,
                      joined.number)

    def _next_round(self) -> Round:
        """torch's rendezvous (``Rendezvous.next_round``, bounded by ``join_timeout``), on a
        helper thread, so that a signal ends the wait at once: the handler only sets the
        event waited on here. The thread is then left to end on its own (the agent leaves).

        Raises:
            _Interrupted: a signal came first.
            RendezvousError: as ``next_round`` does.
        """
        answer: list[Round | BaseException] = []

        def join() -> None:
            try:
                answer.append(self._rdzv.next_round(self._config.nproc))
            except BaseException as exc:  # noqa: BLE001 (raised again in the agent's thread)
                answer.append(exc)
            finally:
                self._in_rendezvous.clear()
                self._joined.set()

        self._joined.clear()
        self._in_rendezvous.set()
        threading.Thread(target=join, name="rankguard-rendezvous", daemon=True).start()
        if self._signal_received() is None:
            self._joined.wait()  # the thread's call is bounded (join_timeout)
        if self._signal_received() is not None:
            raise _Interrupted("the agent received a signal while it waited for the round")
        if isinstance(answer[0], BaseException):
            raise answer[0]
        return answer[0]

    def outside_fault(self, now: float) -> Fault | None:
        end = self._channel.end if self._channel is not None else None
        if end is None:
            return self._silent_fault(now)
        if end.ok or end.node == self._group_rank:
            return None
        self._outside = end.fault(now)
        if end.kind == FaultKind.STORE_LOST and end.node < 0:  # the watcher lost the round's store
            self._outside = self._store_fault(self._outside.at, self._outside.detail)
        return self._outside

    def _silent_fault(self, now: float) -> Fault | None:
        """A node (or the store) silent past ``--hang-timeout`` ends the round: the first agent
        to see it says so in the round's end (a lost store cannot be told; each node sees it).

        Unless this agent was itself stopped (SIGSTOP of its tree, a frozen machine) for longer
        than that: the other nodes have counted *this* node silent meanwhile and gone on
        without it, or ended. It ends too, naming itself (``node_stopped``, no restart)."""
        if self._beats is None or self._channel is None:
            return None
        last, self._last_look = self._last_look, now
        stopped_s = now - last if last is not None else 0.0
        if stopped_s > max(self._config.hang_timeout, _OWN_STOP_FLOOR_S):
            self._outside = Fault(FaultKind.NODE_STOPPED, now, None, f"this node's agent was stopped "
                                  f"for {stopped_s:.1f} s, longer than --hang-timeout "
                                  f"{self._config.hang_timeout:g} s: the other nodes have "
                                  "counted this node lost, and gone on without it or ended")
            return self._outside
        quiet = self._beats.silence(now, self._config.hang_timeout, frozenset(self._awaited))
        overdue = self._takeovers_done(now)
        if overdue is not None:
            return overdue
        if quiet is None:
            return None
        if quiet.node is not None and self._ask_takeover(quiet, now):
            return None
        return self._lost(quiet, now)

    # -- a standby node takes a lost node's place (--recovery in-place) ------------------------

    def _takeover_allowed(self) -> bool:
        """In-place recovery, a secret the nodes share, and the job's store for the rounds'
        traffic (with etcd-v2 a round's store is its node 0's: a standby could not reach it
        before it has joined)."""
        return self._config.in_place and node_takeover.possible() and not self._job.round_stores

    def _stand_by_in_place(self) -> node_takeover.Takeover | None:
        """A node that comes while a round runs waits to take the place of one of its nodes
        that is lost (``node_takeover``); returns the request it claimed, or None when no round
        runs, or once the round or the job ended (then it joins the next round as usual)."""
        if not self._takeover_allowed():
            return None
        store, run_id = self._store, self._config.run_id
        rounds = store.add(rounds_key(run_id), 0)
        prefix = agents_namespace(run_id, rounds - 1)
        if rounds == 0 or store.check([end_key(prefix)]):
            return None
        node_takeover.stand_by(store, prefix)
        self._journal.write("standby", attempt=0, round=rounds - 1)
        self._say(f"rankguard: round {rounds - 1} is running: this node stands by to take the "
                  "place of a node that is lost")
        seen = 0
        while True:
            if self._signal_received() is not None:
                raise _Interrupted("the agent was stopped while it stood by")
            if store.check([end_key(prefix)]) or self._rdzv.recorded_end() is not None:
                return None
            request, seen = node_takeover.take(store, prefix, seen, self._config.nproc)
            if request is not None:
                self._say(f"rankguard: taking the place of node {request.node} of round "
                          f"{request.number}: {request.cause}")
                return request
            time.sleep(margins.TICK_S)

    @staticmethod
    def _took_over(request: node_takeover.Takeover) -> Round:
        return Round(request.number, request.node, request.nodes, request.base, request.world,
                     request.store_host, request.store_port)

    def replacing_a_node(self) -> bool:
        return self._takeover is not None

    def started(self, ranks: RankProcesses) -> None:
        self._ranks = ranks
        request = self._takeover
        if request is None or self._in_place is None:
            return
        fault_at = time.monotonic() - node_takeover.since_lost(request)
        for member in ranks:
            self._in_place.adopt(member, ranks.number, recovery_path(
                os.path.dirname(member.log_path), member.rank), fault_at,
                f"node {request.node} was lost: {request.cause}")

    def _ask_takeover(self, quiet: Silence, now: float) -> bool:
        """Have a waiting standby take the silent node's place rather than end the round;
        returns whether one will be given the time to (``margins.replacement_limit``)."""
        node = quiet.node
        assert node is not None and self._layout is not None
        if not self._takeover_allowed() or self._in_place is None:
            return False
        prefix = agents_namespace(self._config.run_id, self._layout.round or 0)
        request = node_takeover.Takeover(
            self._layout.round or 0, node, self._group_world, node * self._config.nproc,
            self._layout.world, self._round_addr[0], self._round_addr[1],
            quiet.describe(self._store_name),
            time.time() - quiet.silent_s)
        try:
            if node_takeover.standbys(self._round_store, prefix) == 0:
                return False
            asked = node_takeover.ask(self._round_store, prefix, request)
        except RuntimeError:
            return False  # the store failed: the round ends (_lost says so)
        limit = margins.replacement_limit(self._config.hang_timeout)
        self._awaited[node] = (Deadline.after(limit), now)
        self._lost_nodes += 1  # its agent will never leave the job
        for member in self._ranks.live() if self._ranks is not None else []:
            # a collective they wait in raises PeerFailed at once; they regroup without it
            _ledger.post_notice(member.ledger_path, _ledger.NOTICE_DIED, request.base)
        self._journal.write("node_takeover", node=node, asked=asked, cause=request.cause,
                            limit_s=limit)
        self._say(f"rankguard: {request.cause}; a standby node takes its place (the ranks wait "
                  f"for it, up to {limit:g} s)")
        return True

    def _takeovers_done(self, now: float) -> Fault | None:
        """Forget the lost nodes whose place a standby took (it beats as that node); the
        fault that ends the round for one whose place was not taken in time."""
        assert self._beats is not None
        for node, (limit, asked_at) in list(self._awaited.items()):
            host = self._beats.beating_since(node, asked_at)
            if host is not None:
                del self._awaited[node]
                self._journal.write("node_taken_over", node=node, host=host,
                                    since_asked_s=round(now - asked_at, 3))
                self._say(f"rankguard: a standby node (host {host}) took the place of node "
                          f"{node}")
            elif limit.passed():
                del self._awaited[node]
                self._lost_nodes -= 1  # the round's end counts it (node_lost)
                return self._lost(Silence(node, now - asked_at), now)
        return None

    def _lost(self, quiet: Silence, now: float) -> Fault:
        """End the round with the silent node (or the store) named; the fault that stands."""
        assert self._channel is not None
        text = quiet.describe(self._store_name)
        if quiet.node is None:
            self._outside = self._store_fault(now - quiet.silent_s, text)
            return self._outside
        ours = RoundEnd(False, self._group_rank, FaultKind.NODE_LOST, None, text)
        try:
            standing = self._channel.publish(ours)
        except RuntimeError as exc:
            self._outside = self._store_fault(now, self._store_failure(exc))
            return self._outside
        self._outside = (Fault(FaultKind.NODE_LOST, now - quiet.silent_s, None, text)
                         if standing is ours else standing.fault(now))
        return self._outside

    def observed(self, snaps: dict[int, RankProgress]) -> None:
        # a new list each time: the beats' thread reads whichever it finds, never a half one
        self._progress = [beat_entry(rank, snap) for rank, snap in sorted(snaps.items())
                          if snap.groups]
        self._asynchronous = [group for rank, snap in sorted(snaps.items())
                              for group in beat_async(rank, snap)]
        offset = wall_offset()
        self._left = [left for rank, snap in sorted(snaps.items())
                      if (left := beat_left(rank, snap, offset)) is not None]
        self._snaps = snaps

    def remote_ranks(self, snaps: dict[int, RankProgress],
                      now: float) -> dict[int, RankProgress]:
        if self._beats is None or self._remote is None:
            return {}
        self._remote.update(self._beats.heard())
        cutoff = now - self._config.hang_timeout
        waiting = any(group.waiting and group.last_event <= cutoff
                      for snap in snaps.values() for group in snap.groups)
        return self._remote.snapshots(cutoff, waiting)

    def cause_of(self, fault: Fault, now: float) -> Fault | Later:
        """An error inside a collective while a node has gone quiet (its agent and ranks were
        killed: their connections broke at once) is that node's loss; one in an operation that
        another node's rank left before (code 0) is that rank's early exit. Decided once every
        other node has beaten since (the error is this node's own), one of them has not beaten
        twice, or ``--hang-timeout`` has passed (a silent node is then named by
        ``_silent_fault``)."""
        if not self._judges(fault):
            return fault
        judged, quiet = self._cascade_judged(fault)
        return self._named(fault, quiet, now) if judged else LATER

    def cause_once_ended(self, fault: Fault) -> Fault:
        if not self._judges(fault):
            return fault
        assert self._channel is not None
        until = self._cascade_until(fault)
        judged, quiet = self._cascade_judged(fault)
        while not judged:
            self._channel.wait(until.within(margins.TICK_S))
            judged, quiet = self._cascade_judged(fault)
        return self._named(fault, quiet, time.monotonic())

    def _judges(self, fault: Fault) -> bool:
        """Whether ``fault`` may be another node's effect: an error inside a collective, in a
        round this node is in."""
        return fault.cascade and self._beats is not None and self._channel is not None

    def _cascade_until(self, fault: Fault) -> Deadline:
        return Deadline(fault.at + self._config.hang_timeout, self._config.hang_timeout)

    def _cascade_judged(self, fault: Fault) -> tuple[bool, Silence | None]:
        """Whether the beats tell now where ``fault`` came from, and the node quiet since."""
        beats, channel = self._beats, self._channel
        assert beats is not None and channel is not None
        quiet = beats.quiet_since(fault.at, _CRASH_EVIDENCE_BEATS * self._beat_period)
        judged = (quiet is not None or beats.all_alive_after(fault.at) or channel.end is not None
                  or self._cascade_until(fault).passed()
                  or self._signal_received() is not None)
        return judged, quiet

    def _named(self, fault: Fault, quiet: Silence | None, now: float) -> Fault:
        """``fault``, or the loss of the node found quiet since, or the early exit of another
        node's rank that this node's ranks went on without (``outcome.remote_departure``)."""
        if quiet is not None and quiet.node is not None:
            return self._lost(quiet, time.monotonic())
        if self._remote is None or self._beats is None:
            return fault
        self._remote.update(self._beats.heard())
        return remote_departure(self._remote.departures(), self._snaps, now,
                                self._config.hang_timeout) or fault

    def _node_of(self, fault: Fault) -> int:
        """The node of the rank at ``fault``: this one, unless another node's beats carry it."""
        if fault.rank is None or fault.rank in self._local_ranks or self._remote is None:
            return self._group_rank
        node = self._remote.node_of(fault.rank)
        return self._group_rank if node is None else node

    def leaves_to_others(self, verdict: Verdict) -> bool:
        return left_to_another_node(verdict, self._local_ranks, self._group_world,
                                    self._config.hang_timeout)

    def agree_on_end(self, fault: Fault | None,
               hang: Verdict | None) -> tuple[Fault | None, Verdict | None]:
        channel = self._channel
        assert channel is not None
        try:
            fault, hang = self._agree_on_end_with(channel, fault, hang)
        except RuntimeError as exc:  # the store failed under a request of ours
            fault = self._store_fault(time.monotonic(), self._store_failure(exc))
            self._say(f"rankguard: {fault.describe()}")
        if fault is not None and fault.kind == FaultKind.STORE_LOST:
            self._store_lost = True
        end = channel.end
        self._journal.write("round_end", ok=fault is None,
                            node=end.node if end is not None else None,
                            rank=end.rank if end is not None else None,
                            root_cause=end.describe() if end is not None and not end.ok else None)
        return fault, hang

    def _agree_on_end_with(self, channel: RoundChannel, fault: Fault | None,
                     hang: Verdict | None) -> tuple[Fault | None, Verdict | None]:
        node = self._group_rank
        if fault is not None:
            if fault is not self._outside:  # this node's own: end the round with it
                self._end_round(channel.publish(RoundEnd.of(fault, self._node_of(fault))))
            return fault, hang
        channel.done()
        self._last_look = None  # the attempt's teardown is no gap of this agent's
        while channel.end is None and self._signal_received() is None:
            channel.wait(Deadline.after(margins.TICK_S))
            silent = self._silent_fault(time.monotonic())
            if silent is not None:
                self._say(f"rankguard: {silent.describe()}")
                return silent, hang
        end = channel.end
        now = time.monotonic()
        if self._signal_received() is not None:
            fault = Fault(FaultKind.LAUNCHER_SIGNAL, now, None, "the agent received a signal")
            channel.publish(RoundEnd.of(fault, node))
        elif end is not None and not end.ok:
            fault = end.fault(now)
            hang = fault.verdict
            self._say(f"rankguard: {fault.describe()}")
        return fault, hang

    def _end_round(self, standing: RoundEnd) -> None:
        """Our fault was published; if another node's stood first (the two met), the job's
        root cause is that one: keep ours for this node's journal, say the other."""
        if standing.node != self._group_rank and not standing.ok:
            self._say(f"rankguard: the round had already ended on node {standing.node}: "
                      f"{standing.describe()}")

    # -- the end of the job ------------------------------------------------------------------------

    def _close_round(self) -> None:
        if self._channel is not None:
            end = self._channel.end
            if (end is not None and end.kind == FaultKind.NODE_LOST) or self._round_host_lost:
                self._lost_nodes += 1  # it will never leave the job
            self._round_host_lost = False
            self._channel.close()
            self._channel = None
        if self._beats is not None:
            self._beats.close()
            self._beats = None

    def leave(self, fault: Fault | None) -> None:
        """Close the rendezvous when the job ends here (not when only this node leaves: it was
        stopped, or stood by); count this agent out. The store's host then waits, up to
        ``close_timeout``, until every agent that came (standbys too) has left, but for the
        nodes found lost: none must lose the store while it still reads the job's end. The
        whole is bounded (``store_calls``), a frozen store's host included."""
        self._close_round()
        cfg = self._rdzv_cfg
        if self._store_lost:  # its requests could block for good: nobody is left to tell
            return
        # torch's close and the host's wait for the others each take up to close_timeout
        limit = Deadline.after(2 * cfg.close_timeout + cfg.read_timeout)
        if self._in_rendezvous.is_set():
            # a signal ended the wait for the round (a standby preempted, say), whose store
            # calls still use the store's client: this node only says it left, on a client of
            # its own, or the store's host would wait close_timeout for it at the job's end. A
            # store this node hosts ends with it: nobody to tell
            if self._counted and not self._job.hosting:
                try:
                    within(limit, "leaving the job", lambda: self._count_out(
                        fault, False, self._store if self._job.round_stores else
                        self._job_client()))
                except (StoreStalled, RuntimeError):
                    pass  # the others wait for it up to close_timeout, as for a lost node
            return
        # the job ends here, or goes on without this node; but not without the job's store
        ending = (fault is None or fault.kind not in (FaultKind.LAUNCHER_SIGNAL, FaultKind.STANDBY_END)
                  or (self._job.hosting and not self._job.round_stores))
        try:
            within(limit, "leaving the job", lambda: self._count_out(fault, ending, self._store))
        except StoreStalled:
            self._say(f"rankguard: the job's store at {cfg.endpoint} did not answer while this "
                      "node left the job (its host is frozen?); leaving anyway")

    def _count_out(self, fault: Fault | None, ending: bool, store: Any) -> None:
        """``leave``'s store requests, on ``store`` (a client of the job's store): the job's
        end (when ``ending`` here, with ``fault``), then this agent's count."""
        cfg = self._rdzv_cfg
        if ending:
            self._rdzv.record_end(*self.run_status(fault, self._signal_received()))
            self._rdzv.shutdown()
        key = left_key(self._config.run_id)
        try:
            store.set(f"{key}.{store.add(key, 1)}", "1")
            if self._hosting:
                came = store.add(self._agents_key, 0)
                store.wait([f"{key}.{max(came - self._lost_nodes, 1)}"],
                           timedelta(seconds=cfg.close_timeout))
        except RuntimeError:
            if self._hosting:
                self._say(f"rankguard: not every node left the job within close_timeout "
                          f"{cfg.close_timeout} s; closing the store at {cfg.endpoint} anyway")

    def _store_failure(self, exc: Exception) -> str:
        """What a store request that failed says: the round's store is gone."""
        return f"lost {self._store_name}: {first_line(exc)}"

    def _store_fault(self, at: float, detail: str) -> Fault:
        """The round's store failed or went silent. With c10d it is the job's: the job ends
        (``store_lost``). With etcd-v2 it is node 0's: that node is lost (``node_lost``), and
        the next round forms through etcd without it."""
        if not self._job.round_stores:
            return Fault(FaultKind.STORE_LOST, at, None, detail)
        self._round_host_lost = True
        return Fault(FaultKind.NODE_LOST, at, None, f"node 0 of the round, which hosts its store, is "
                     f"lost: {detail}")

    def _use_round_store(self, joined: Round) -> None:
        """The round's store, with etcd-v2: node 0 hosts it, the others are its clients.

        Raises:
            RendezvousError: it did not answer (node 0 was lost as the round formed).
        """
        if not self._job.round_stores:
            return
        self._round_addr = (joined.store_host, joined.store_port)
        self._hosting = joined.store is not None
        try:
            self._round_store = joined.store if self._hosting else self._connect()
        except RuntimeError as exc:
            raise RendezvousError(joined.store_endpoint, f"node 0 of round {joined.number} "
                                  f"did not answer at {joined.store_endpoint}: "
                                  f"{first_line(exc)}") from None

    @property
    def _store_name(self) -> str:
        """The round's store, for messages."""
        where = endpoint(*self._round_addr)
        if self._job.round_stores:
            return f"the round's store at {where} (hosted by node 0)"
        return f"the job's store at {where}"

    @property
    def _agents_key(self) -> str:
        """How many agents came to the job (counted once each, as they first join)."""
        return agents_key(self._config.run_id)

    # -- plumbing ------------------------------------------------------------------------------

    def _connect(self) -> Any:
        """Another client of the round's store (the round watcher's, the beats')."""
        from torch.distributed import TCPStore

        host, port = self._round_addr
        return TCPStore(host, port, is_master=False,
                        timeout=timedelta(seconds=self._rdzv_cfg.read_timeout))

    def _job_client(self) -> Any:
        """Another client of the job's c10d store (the rendezvous thread may hold this
        agent's). Bounded by ``read_timeout``; raises RuntimeError as torch's client does."""
        from torch.distributed import TCPStore

        cfg = self._rdzv_cfg
        return TCPStore(cfg.host, cfg.port, is_master=False,
                        timeout=timedelta(seconds=cfg.read_timeout))

    def interrupt(self) -> None:
        if self._channel is not None:
            self._channel.interrupt()
        self._joined.set()


def main(config: RunConfig) -> int:
    """Run this node's agent, then end the process with its exit code (see below why not by
    returning).

    Raises:
        UsageError: the job's store cannot be reached or hosted; nothing was started.
    """
    assert config.rendezvous is not None
    job = connect(config.rendezvous, config.run_id)
    try:
        early_signals.check()
    except early_signals.Interrupted as stop:  # before any rank: as a usage error ends
        remove_empty_dirs(config.made_dirs)
        print(f"rankguard run: {stop}; nothing was started", file=sys.stderr, flush=True)
        os._exit(128 + stop.signum)  # see below why not by returning
    code = Agent(config, config.rendezvous.port, lambda context: MultiNode(context, job)).run()
    # Everything of the job is written and closed by now; the interpreter's own exit could
    # still abort the process ("terminate called without an active exception", exit -6):
    # - a store this process hosts is still open to clients that may never close their
    #   connections, and torch's server, destroyed at exit, would wait for them, then abort;
    # - a store call given up at its deadline (``store_calls.within``: the job's store host
    #   was lost) leaves its thread inside torch's client, which the exit unwinds.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
