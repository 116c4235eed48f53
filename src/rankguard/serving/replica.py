"""One replica of a pool: N rank processes (``serving.worker``) that form one process group
(gloo, or NCCL on the devices of its ``serving.placement``), on a TCPStore of its own hosted in
the leader (on loopback only: ``rankguard.store_server``), and serve requests one at a time.

A replica is started, becomes ready once every rank has run the user's setup, runs requests,
and is retired after a fault: regrouped in place when every rank is alive and answered, killed
(SIGKILL of each rank's process tree, and of what carries the replica's marker) otherwise.

Its ranks are a set of the supervisor of rank processes (``rankguard.supervisor``), driven by a
watcher thread of their own: every exit (pidfd), every message on the ranks' channels and every
timer is an event that wakes it, and it records what happened under the replica's condition.
Whoever waits (a request, a start-up, a regroup, a close) waits on that condition, bounded by
its :class:`~rankguard.deadline.Deadline`: no polling tick anywhere. ``on_change`` tells the
owner (the pool) when the replica became ready, failed to start, or lost a rank.

The verdict on a request that did not succeed is ``serving.verdict``'s, over a snapshot of what
the ranks answered, their ledgers and their process states.
"""

from __future__ import annotations

import enum
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Collection, Iterable

from ..records import ledger as _ledger
from ..records import private_files
from ..processes import proctree
from ..store import sealed, store_server
from ..deadline import Deadline
from ..errors import UsageError
from ..records.ledger import LedgerReader
from ..runtime import stacks, vacancies
from ..supervisor import RankFiles, RankProcess, RankProcesses, spawn
from ..inputs.nccl_env import nccl_settings
from . import leader_env
from ..runtime.init import GRACE_ENV
from .budgets import (COLLECTIVE_MARGIN_S, EXIT_STATUS_S, POOL_RANK_GRACE_S, REAP_S,
                      REGROUP_MARGIN_S, SEND_S, SHUTDOWN_MARGIN_S, STORE_S)
from .channel import ChannelClosed, LeaderEnd, Unreadable, dumps, pair
from . import messages as _messages
from .messages import Op
from .placement import ReplicaPlacement
from .verdict import CHANNEL_CLOSED, Ending, Outcome, verdict

WORKER_MODULE = "rankguard.serving.worker"
GONE_WAIT_S = 1.0  # how long a survivor that could not be told to regroup is given to be reaped
_WORKER = [sys.executable, "-m", WORKER_MODULE]


StartRank = Callable[[dict[str, str], str, int], Any]  # (env, log, channel fd) -> process


def cold_start(env: dict[str, str], log: str, channel_fd: int) -> Any:
    """A rank of a replica in a new Python process (``python -m rankguard.serving.worker``)."""
    return spawn(_WORKER, env, log=log, pass_fds=(channel_fd,))


class StartState(enum.StrEnum):
    """Where a replica's start-up stands."""

    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"  # see ``Replica.failure``


@dataclass(frozen=True)
class Replacement:
    """How :meth:`Replica.replace_ranks` went: ``ok``, else ``why`` not; ``parts``: seconds
    per step (``stop``: the old processes killed and reaped; ``finish``: until the survivors
    had finished the failed call; ``spawned``: the new ones
    started; ``joined``: until the generation formed and every new rank ran its setup; and
    each new rank's own ``rank<r>_<step>``: ``process`` until its code ran (an interpreter's
    start, or a fork), then ``init`` (the rank runtime; torch imported, unless forked),
    ``device`` (CUDA's context), ``group`` (joining the generation; on NCCL the communicator
    forms at the first collective) and ``setup`` (loading its shard))."""

    ok: bool
    why: str
    parts: dict[str, float]
    ranks: tuple[int, ...] = ()  # the ranks whose processes were replaced


@dataclass
class StartFailure:
    """Why a replica did not become ready."""

    rank: int | None
    detail: str
    remote_traceback: str = ""  # the setup's, when it raised

    def describe(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "the replica"
        return f"{who} {self.detail}"


class Replica:
    """N rank processes of one process group serving requests; see the module docstring.

    Args:
        number: the replica's number in its pool (names its folder and its journal events).
        world: how many ranks.
        setup: ``setup(rank, world_size) -> state``, run in each rank once the group formed.
        folder: where each rank's output, ledger and stacks go (``rank<r>.log``...).
        env: extra environment for the ranks.
        start_by: when the replica must be ready; past it, it has failed to start.
        on_change: called, from the watcher thread and under no lock of the replica's, when the
            replica became ready, failed to start, or lost a rank. Must not wait for the
            replica.
        start_rank: ``start_rank(env, log, channel_fd)`` starts one rank process running
            ``serving.worker`` (a ``subprocess.Popen`` or a stand-in with ``pid``, ``poll`` and
            ``wait``): its channel to the leader is ``channel_fd``, its output goes to ``log``.
            Default: a new Python (:func:`cold_start`); a pool forks them from its zygote.
        placement: where its ranks run (default: the CPU, over gloo); each rank learns its
            device and backend from its environment (``ReplicaPlacement.rank_env``).
        slot: the pool's slot it holds (``serving.placement``), while it lives.
    """

    def __init__(self, number: int, world: int, setup: Callable[[int, int], Any] | None,
                 folder: str, env: dict[str, str], start_by: Deadline,
                 on_change: Callable[[], None] = lambda: None,
                 start_rank: StartRank | None = None,
                 placement: ReplicaPlacement | None = None, slot: int = 0) -> None:
        self.number = number
        self.world = world
        self.placement = placement or ReplicaPlacement(world)
        self.slot = slot
        self.folder = folder
        self.started_at = time.monotonic()
        self.ready_at: float | None = None
        self.failure: StartFailure | None = None
        self.killed = False
        self._start_by = start_by
        self._on_change = on_change
        self._cond = threading.Condition()
        self._ready: set[int] = set()
        self._dead: dict[int, Ending] = {}  # rank -> how it ended
        self._requests = 0
        self._current: Outcome | None = None  # the last request's outcome
        self._unfinished = False  # the last request failed, and may still be running
        self._regrouped: dict[int, bool] = {}  # rank -> whether it formed the new generation
        self._finishing = False
        private_files.private_dir(folder, "log_dir")  # 0700, as rankguard run's attemptN
        self._store: Any = store_server.host_on_loopback(STORE_S)
        base = {**os.environ, **leader_env.leader_context(), **env,
                "MASTER_ADDR": store_server.LOOPBACK, "MASTER_PORT": str(self._store.port),
                "WORLD_SIZE": str(world), "TORCHELASTIC_USE_AGENT_STORE": "True",
                **sealed.host_env(),  # this replica's own store seal
                vacancies.REPLACING_ENV: "0",  # a replacement is told so (replace_ranks)
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        base.update(nccl_settings(base))  # as rankguard run's ranks: rankguard decides faults
        base.setdefault(GRACE_ENV, f"{POOL_RANK_GRACE_S:g}")
        self._base_env = base
        self._setup = setup
        self._start_rank = start_rank or cold_start
        self._ranks = RankProcesses(number, world)
        self.ends: list[LeaderEnd] = []
        self._ledgers: list[LedgerReader] = []
        self._incarnations = [0] * world  # per rank: how many processes replaced its first
        self._replacing: dict[int, str | None] = {}  # rank -> why its new process failed
        self.parts: dict[int, dict[str, float]] = {}  # rank -> its start's seconds per step
        self._launched_at = [0.0] * world  # per rank: when its process was started
        try:
            for rank in range(world):
                self._launch(rank, self._start_rank, {})
        except BaseException:  # no descriptor, no memory: what started goes, reaped
            self.kill(wait=True)
            raise
        self._ranks.call_at(start_by, self._start_overdue)
        self._ranks.watch(self._on_exit, f"rankguard-replica{number}")
        for end in self.ends:
            self._send_start(end)

    def _launch(self, rank: int, start_rank: StartRank, extra_env: dict[str, str]) -> None:
        """Start a process for rank ``rank`` (its first, or a replacement of one that is gone
        and reaped), with its channel and ledger; its START is sent by the caller."""
        name = f"rank{rank}" if not self._incarnations[rank] else \
            f"rank{rank}.{self._incarnations[rank]}"
        files = RankFiles(log=os.path.join(self.folder, f"rank{rank}.log"),
                          stacks=os.path.join(self.folder, f"rank{rank}.stacks"),
                          ledger=os.path.join(self.folder, f"{name}.ledger"))
        mine, theirs = pair()
        self._launched_at[rank] = time.monotonic()
        try:
            env = {**self._base_env, "RANK": str(rank), "LOCAL_RANK": str(rank),
                   leader_env.FD: str(theirs.fileno()), _ledger.PATH_ENV: files.ledger,
                   stacks.PATH_ENV: files.stacks, **self.placement.rank_env(rank), **extra_env}
            launch = partial(start_rank, log=files.log, channel_fd=theirs.fileno())
            if rank < len(self.ends):
                self._ranks.replace(rank, files, env, launch)
            else:
                self._ranks.start(rank, files, env, launch)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        end = LeaderEnd(mine)
        reader = LedgerReader(files.ledger)
        if rank < len(self.ends):  # the replaced process's (its ledger file is gone)
            self.ends[rank].close()
            self._ledgers[rank].close()
            self.ends[rank], self._ledgers[rank] = end, reader
        else:
            self.ends.append(end)
            self._ledgers.append(reader)
        self._ranks.add_reader(end.fileno(), partial(self._on_readable, rank,
                                                     self._incarnations[rank]))

    def _send_start(self, end: LeaderEnd) -> None:
        try:
            end.send({"op": Op.START, "setup": self._setup}, Deadline.after(SEND_S))
        except (ChannelClosed, TimeoutError):
            pass  # that rank is gone already: its exit says so

    # -- what it is -------------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        return self._ranks.pids

    def log_path(self, rank: int) -> str:
        return self._ranks[rank].log_path

    def stacks_path(self, rank: int) -> str:
        return self._ranks[rank].stacks_path

    def log_size(self, rank: int) -> int:
        try:
            return os.path.getsize(self.log_path(rank))
        except OSError:
            return 0

    def log_since(self, rank: int, offset: int = 0, limit: int = 4000) -> str:
        """What rank ``rank`` wrote after byte ``offset`` of its log: the last ``limit``
        characters of it, after ``...`` when cut."""
        try:
            with open(self.log_path(rank), errors="replace") as f:
                f.seek(offset)
                text = f.read()
        except OSError:
            return ""
        return text if len(text) <= limit else "...\n" + text[-limit:]

    def describe(self, rank: int) -> str:
        """The rank's process in one line (state, wait channel, command line)."""
        return proctree.describe(self._ranks[rank].pid)

    def ending(self, rank: int) -> str:
        """How the rank's process ended (``exited with code 3``, ``got SIGTERM (tore itself
        down, exited with code 0)``); "" while it runs."""
        return Ending.of(self._ranks[rank].proc.poll(), self._terminated(rank)).detail

    def alive(self) -> bool:
        return not self.killed and not self._dead and all(
            member.proc.poll() is None for member in self._ranks)

    def stopped_ranks(self) -> frozenset[int]:
        """The ranks whose process is stopped (SIGSTOP, a debugger)."""
        return frozenset(member.rank for member in self._ranks
                         if member.proc.poll() is None and proctree.is_stopped(member.pid))

    def dead_ranks(self) -> frozenset[int]:
        """The ranks whose process is gone (or no longer reachable)."""
        with self._cond:
            gone = set(self._dead)
        return frozenset(gone | {member.rank for member in self._ranks
                                 if member.proc.poll() is not None})

    def capture_stacks(self, until: Deadline, ranks: list[int] | None = None) -> dict[int, str]:
        """Ask ``ranks`` (default: all) that are alive for the stacks of all their threads
        (SIGUSR1; a stopped rank is continued to answer); rank -> the dump, for those that
        answered before ``until``. Each dump is also appended to ``stacks_path``."""
        return self._ranks.stacks(until, ranks)

    # -- start-up ---------------------------------------------------------------------------

    def start_state(self) -> StartState:
        """``starting``, ``ready`` or ``failed`` (then see ``failure``); never blocks."""
        if self.ready_at is not None:
            return StartState.READY
        return StartState.STARTING if self.failure is None else StartState.FAILED

    def wait_started(self, until: Deadline) -> StartState:
        """Wait until the replica is ready or failed, at most until ``until`` (past the
        replica's ``start_by``, it has failed); returns :meth:`start_state`."""
        with self._cond:
            self._cond.wait_for(lambda: self.start_state() != StartState.STARTING,
                                until.wait_time())
        if not self._start_by.passed():
            return self.start_state()
        self._start_overdue()
        return self.start_state()

    def _start_overdue(self) -> None:
        with self._cond:
            if self.ready_at is not None or self.failure is not None:
                return
            late = sorted(set(range(self.world)) - self._ready)
            self.failure = StartFailure(late[0], f"was not ready within "
                                        f"{self._start_by.seconds:g} s (ranks not ready: "
                                        f"{', '.join(map(str, late))})")
            self._cond.notify_all()
        self._on_change()

    # -- events (from the watcher thread) ---------------------------------------------------

    def _on_readable(self, rank: int, incarnation: int) -> None:
        end = self.ends[rank]
        try:
            messages = end.receive()
        except ChannelClosed:
            self._ranks.remove_reader(end.fileno())
            self._ranks.call_at(Deadline.after(EXIT_STATUS_S),
                                partial(self._gone, rank, CHANNEL_CLOSED, incarnation))
            return
        self._take(rank, messages)

    def _on_exit(self, member: RankProcess) -> None:
        if member is not self._ranks[member.rank]:
            return  # a replaced process, whose exit was reported before its replacement
        end = self.ends[member.rank]
        self._take(member.rank, end.drain())  # what it said before it ended comes first
        self._ranks.remove_reader(end.fileno())
        self._gone(member.rank, Ending.of(member.returncode, self._terminated(member.rank)),
                   self._incarnations[member.rank])

    def _terminated(self, rank: int) -> bool:
        """Whether rank ``rank``'s ledger says it got SIGTERM and tore itself down."""
        try:
            return self._ledgers[rank].read().terminating
        except ValueError:  # the replica was closed meanwhile: its ledgers are unmapped
            return False

    def _take(self, rank: int, messages: list[Any]) -> None:
        changed = False
        with self._cond:
            for message in map(_readable, messages):
                op = message.get("op")
                if op == Op.READY:
                    self._ready.add(rank)
                    self.parts[rank] = {"process": max(message.get("began", 0.0)
                                                       - self._launched_at[rank], 0.0),
                                        **(message.get("parts") or {})}
                    if len(self._ready) == self.world and \
                            self.start_state() == StartState.STARTING:
                        self.ready_at = time.monotonic()
                        changed = True
                elif op == Op.SETUP_FAILED and self.start_state() == StartState.STARTING:
                    self.failure = StartFailure(
                        rank, f"failed its setup: {message['error']}: {message['message']}",
                        message["traceback"])
                    changed = True
                elif op == Op.SETUP_FAILED and rank in self._replacing:
                    self._replacing[rank] = (f"failed its setup: {message['error']}: "
                                             f"{message['message']}")
                elif op == Op.ANSWER:
                    outcome = self._current
                    if outcome is None or message["id"] not in (self._requests, None):
                        continue  # not an answer to the request in flight
                    outcome.order.append(rank)
                    if message["ok"]:
                        outcome.results[rank] = message["result"]
                    else:
                        outcome.failures[rank] = message
                elif op == Op.REGROUPED:
                    self._regrouped[rank] = message["ok"]
            self._cond.notify_all()
        if changed:
            self._on_change()

    def _gone(self, rank: int, ending: Ending, incarnation: int) -> None:
        """Rank ``rank``'s process ``incarnation`` ended (``ending`` says how) or can no longer
        be reached."""
        with self._cond:
            if rank in self._dead or incarnation != self._incarnations[rank]:
                return
            self._dead[rank] = ending
            if self.start_state() == StartState.STARTING:
                output = self.log_since(rank, limit=2000).strip()
                self.failure = StartFailure(rank, f"exited during start-up ({ending.detail})"
                                            + (f":\n{output}" if output else ""))
            outcome = self._current
            if outcome is not None and rank not in outcome.dead:
                outcome.dead[rank] = ending
                outcome.order.append(rank)
            if self._unfinished and not self.killed:
                self._tell_peers(rank)
            self._cond.notify_all()
        self._on_change()

    def _tell_peers(self, rank: int) -> None:
        """Under the condition: rank ``rank`` died mid-request; its live peers learn it from
        their ledgers, so that a collective they wait in for it fails at once (on NCCL, by
        aborting the communicator: a dead peer breaks no connection there), not at the
        request's deadline."""
        for peer, reader in enumerate(self._ledgers):
            if peer != rank and peer not in self._dead and not self._ranks[peer].killed:
                try:
                    _ledger.post_notice(reader.path, _ledger.NOTICE_DIED, rank)
                except (OSError, ValueError):
                    pass  # its ledger is gone: so is the rank, which its exit says

    # -- requests ---------------------------------------------------------------------------

    def run(self, command: dict[str, Any], started: float, until: Deadline) -> dict[int, Any]:
        """Run ``command`` (``fn``, ``args``, ``kwargs``, ``all``) on every rank, its
        collectives bounded by ``until`` less ``COLLECTIVE_MARGIN_S``; results by rank (only
        rank 0's unless ``all``). ``started`` (monotonic) is when the call began.

        Raises:
            RequestFailed: a rank raised, exited, was killed, froze, or was still running at
                ``until`` while a peer waited for it or had answered; ``rank`` None when every
                rank answered with a collective error, or when every rank was still running at
                ``until`` and none was behind (cause ``deadline``: see :meth:`drain`). Raised
                by ``until`` plus the time to read the ranks' ledgers, and as soon as the root
                cause is known or every rank has answered.
            UsageError: the command cannot be pickled (no rank got it).
        """
        collectives_until = until.before(COLLECTIVE_MARGIN_S)
        outcome = self.submit(command, collectives_until, until)

        def known(o: Outcome) -> bool:
            return (o.all_accounted(self.world)
                    or verdict(self.world, o, 0.0, final=False) is not None)

        seen = self.wait(outcome, until, known)
        final = len(seen.results) < self.world
        silent = set(range(self.world)) - seen.answered - set(seen.dead)
        error = verdict(self.world, seen, time.monotonic() - started, final=final,
                        positions=self._positions() if final else None,
                        stopped={r for r in silent if final and
                                 proctree.is_stopped(self._ranks[r].pid)},
                        arriving={r: sizes for r in silent if final and
                                  (sizes := self.ends[r].arriving()) is not None},
                        out_of_time=collectives_until.passed())
        if error is not None:
            raise error
        with self._cond:
            self._unfinished = False
        return seen.results

    def submit(self, command: dict[str, Any], collectives: Deadline, until: Deadline
               ) -> Outcome:
        """Send ``command`` to every rank, its collectives bounded by ``collectives``, each
        send by ``until`` (and ``SEND_S``); returns the request's outcome, which the watcher
        fills in as answers and deaths arrive: read it through :meth:`wait`.

        Raises:
            UsageError: the command cannot be pickled (no rank got it).
        """
        with self._cond:
            request = self._requests + 1
        try:
            data = dumps({"op": Op.RUN, "id": request, "deadline": collectives, **command})
        except Exception as error:  # noqa: BLE001 (whatever pickling raises)
            raise UsageError("Pool.run", f"the function or its arguments cannot be pickled: "
                             f"{error}", "use a module-level function and picklable "
                             "arguments") from None
        outcome = Outcome()
        with self._cond:
            self._requests = request
            self._current = outcome
            self._unfinished = True
            for rank, ending in self._dead.items():
                outcome.dead[rank] = ending
                outcome.order.append(rank)
        for rank, end in enumerate(self.ends):
            if rank in outcome.dead:
                continue
            try:
                end.send_pickled(data, until.within(SEND_S))
            except ChannelClosed:
                continue  # it ended: the watcher records how
            except TimeoutError:
                break  # that rank stopped reading; the verdict at the deadline names it
        return outcome

    def wait(self, outcome: Outcome, until: Deadline, done: Callable[[Outcome], bool]
             ) -> Outcome:
        """Wait until ``done(outcome)`` or ``until``; returns a copy of ``outcome`` as it was
        then (the watcher goes on filling the original)."""
        with self._cond:
            self._cond.wait_for(lambda: done(outcome), until.wait_time())
            return replace(outcome, results=dict(outcome.results),
                           failures=dict(outcome.failures), dead=dict(outcome.dead),
                           order=list(outcome.order))

    def drain(self, until: Deadline) -> frozenset[int]:
        """After a request that failed: wait until ``until`` for every rank to be done with
        it. Returns the ranks that are not: dead, or still running it (empty: every rank is
        alive and idle, and may regroup and serve again)."""
        late = self._unfinished_by(list(range(self.world)), until)
        if not late:
            with self._cond:
                self._unfinished = False
        return frozenset(late) | self.dead_ranks()

    def _positions(self) -> dict[int, _ledger.GroupProgress]:
        """Each rank's world group, from its ledger (ranks without one are left out)."""
        positions = {}
        for rank, reader in enumerate(self._ledgers):
            try:
                groups = reader.read().groups
            except ValueError:  # the replica was closed meanwhile: its ledgers are unmapped
                continue
            slot = next((g for g in groups if g.is_world), None)
            if slot is not None:
                positions[rank] = slot
        return positions

    # -- after a fault ----------------------------------------------------------------------

    def regroup(self, until: Deadline) -> bool:
        """A fresh generation of the same ranks (every rank alive and idle), which must form
        by ``until`` less ``REGROUP_MARGIN_S``; False if it did not by ``until``."""
        with self._cond:
            self._regrouped = {}
        if self._send_regroup(range(self.world), [], until) is not None:
            return False

        def over() -> bool:
            return bool(self._dead) or len(self._regrouped) == self.world or \
                not all(self._regrouped.values())

        with self._cond:
            self._cond.wait_for(over, until.wait_time())
            return not self._dead and len(self._regrouped) == self.world and \
                all(self._regrouped.values())

    def replace_ranks(self, places: Collection[int], until: Deadline, finish_by: Deadline,
                      start_rank: StartRank | None = None) -> Replacement:
        """Replace the processes of ranks ``places`` (SIGKILLed first, when alive, with what
        they started) with new ones, while the other ranks keep theirs (their weights, their
        CUDA context): once the survivors have finished the failed call (by ``finish_by``: one
        still in it then is hung), they form a new generation that keeps every rank's number
        and leaves the replaced places vacant, and each new process (``start_rank``, default
        the replica's own) joins it and runs the setup. A survivor found dead on the way is
        replaced too. Everything by ``until`` (the survivors' generation waits until
        ``REGROUP_MARGIN_S`` before it); returns how it went (``ok`` False: the replica is not
        whole, kill it)."""
        started = time.monotonic()
        places = self._stop(sorted(set(places)), until)
        if places is None:
            return Replacement(False, "a replaced rank's process did not end", {})
        killed = time.monotonic()
        survivors = [rank for rank in range(self.world) if rank not in places]
        late = self._unfinished_by(survivors, finish_by)
        dead = sorted(set(late) & self.dead_ranks())
        if dead:  # died since the plan: replaced as well
            places = self._stop(sorted(set(places) | set(dead)), until) or places
            survivors = [rank for rank in survivors if rank not in dead]
        late = [rank for rank in late if rank not in dead]
        stopped = time.monotonic()
        with self._cond:
            if not survivors:
                ended = [f"rank {rank} {self._dead[rank].detail}" for rank in dead
                         if rank in self._dead]
                return Replacement(False, "; ".join(ended) + ": no rank is left", {})
            if late:
                return Replacement(False, f"ranks {', '.join(map(str, late))} did not finish "
                                   f"the failed call within {finish_by.seconds:g} s", {})
            if self.killed:
                return Replacement(False, "the replica was killed", {})
            self._regrouped = {}
            self._replacing = {rank: None for rank in places}
            for rank in places:
                self._dead.pop(rank, None)
                self._ready.discard(rank)
                self._incarnations[rank] += 1
        refused = self._send_regroup(survivors, places, until)
        if refused is not None:
            return Replacement(False, self._why_not_taken(refused, until), {})
        join = {vacancies.REPLACING_ENV: "1", vacancies.JOIN_TIMEOUT_ENV:
                f"{until.wait_time() / vacancies.REPLACEMENT_WAITS:.3f}"}
        try:
            for rank in places:
                self._launch(rank, start_rank or self._start_rank, join)
                self._send_start(self.ends[rank])
        except Exception as error:  # noqa: BLE001 (no descriptor, no memory...: not whole)
            return Replacement(False, f"a new process could not be started: {error}", {})
        return self._replaced(survivors, places, until,
                              {"stop": killed - started, "finish": stopped - killed,
                               "spawned": time.monotonic() - stopped})

    def _stop(self, places: list[int], until: Deadline) -> list[int] | None:
        """SIGKILL the processes of ``places`` that still run, wait (until ``until``) until
        they are reaped, and kill what each started; ``places``, or None when one did not
        end."""
        members = [self._ranks[rank] for rank in places]
        for member in members:
            member.killed = True
        self._ranks.signal(signal.SIGKILL, members)
        if not self._ranks.wait_exits(until, set(places)):
            return None
        for member in members:  # what it started goes with it; its peers' children stay
            self._ranks.sweep_rank(member)
        return places

    def _unfinished_by(self, ranks: list[int], by: Deadline) -> list[int]:
        """Wait, until ``by``, for ``ranks`` to be done with the failed call (answered, or
        dead); those that are not."""
        outcome = self._current
        if not self._unfinished or outcome is None:
            return sorted(set(ranks) & self.dead_ranks())
        seen = self.wait(outcome, by, lambda o: all(r in o.answered or r in o.dead
                                                    for r in ranks))
        return [rank for rank in ranks if rank not in seen.answered]

    def _replaced(self, survivors: list[int], places: list[int], until: Deadline,
                  parts: dict[str, float]) -> Replacement:
        """Wait, until ``until``, for the survivors' new generation and the new ranks' setups."""
        started = time.monotonic()

        def over() -> bool:
            return bool(self._dead) or any(self._replacing.values()) or \
                not all(self._regrouped.values()) or (
                    all(rank in self._regrouped for rank in survivors)
                    and all(rank in self._ready for rank in places))

        with self._cond:
            self._cond.wait_for(over, until.wait_time())
            failed = next((f"rank {rank} {why}" for rank, why in self._replacing.items()
                           if why), None)
            dead = next((f"rank {rank} {ending.detail}" for rank, ending in self._dead.items()),
                        None)
            late = [rank for rank in places if rank not in self._ready]
            unformed = [rank for rank in survivors if not self._regrouped.get(rank)]
            self._replacing = {}
            for rank in places:
                parts.update({f"rank{rank}_{part}": took
                              for part, took in self.parts.get(rank, {}).items()})
            parts["joined"] = time.monotonic() - started
            why = failed or dead or (
                f"ranks {', '.join(map(str, unformed))} did not form the new generation"
                if unformed else "") or (
                f"ranks {', '.join(map(str, late))} were not ready by the deadline"
                if late else "")
            if not why:
                self._unfinished = False
            return Replacement(not why, why, {part: round(took, 4)
                                              for part, took in parts.items()}, tuple(places))

    def _send_regroup(self, ranks: Iterable[int], vacant: list[int], until: Deadline
                      ) -> int | None:
        """Tell ``ranks`` to regroup; the first that could not be told (None: all were)."""
        for rank in ranks:
            try:
                self.ends[rank].send({"op": Op.REGROUP, "deadline":
                                      until.before(REGROUP_MARGIN_S), "vacant": vacant}, until)
            except (ChannelClosed, TimeoutError):
                return rank
        return None

    def _why_not_taken(self, rank: int, until: Deadline) -> str:
        """Why surviving rank ``rank`` could not be told to regroup: how its process ended,
        once it is reaped (waited for up to ``GONE_WAIT_S``, within ``until``), else that."""
        if not self._ranks.wait_exits(until.within(GONE_WAIT_S), {rank}):
            return f"surviving rank {rank} did not take the regroup"
        return f"rank {rank} {self.ending(rank)}"

    def kill(self, wait: bool = False) -> None:
        """SIGKILL every rank's process tree and what carries the replica's marker, at once;
        then reap them (within ``REAP_S``) and release everything, in the background or
        (``wait``) here. Call it under no lock that ``on_change`` takes."""
        self.killed = True
        self._ranks.kill()
        if wait:
            self._finish()
        else:
            threading.Thread(target=self._finish, name="rankguard-reap", daemon=True).start()

    def _finish(self) -> None:
        with self._cond:
            if self._finishing:
                return
            self._finishing = True
        until = Deadline.after(REAP_S)
        self._ranks.wait_exits(until)
        self._ranks.close(until)
        for end in self.ends:
            end.close()
        for reader in self._ledgers:
            reader.close()
        self._store = None

    def close(self, until: Deadline, cut: bool = False) -> None:
        """Ask the ranks to shut down (a bounded barrier, ending ``SHUTDOWN_MARGIN_S`` before
        ``until``); kill what is left at ``until``, and reap them (``REAP_S`` more at most).
        ``cut``: a request still running is not waited for (its caller has its answer): its
        ranks, which could join the barrier only once it ends, are killed at once."""
        with self._cond:
            running = self._unfinished
        if self.alive() and not (cut and running):
            for end in self.ends:
                try:
                    end.send({"op": Op.EXIT, "deadline": until.before(SHUTDOWN_MARGIN_S)}, until)
                except (ChannelClosed, TimeoutError):
                    break
            self._ranks.wait_exits(until)
        self.kill(wait=True)



def _readable(message: Any) -> Any:
    """``message``, or for one that could not be unpickled here, the failed answer that it
    stands for (most likely it was a result: a rank's own messages hold only plain data)."""
    if not isinstance(message, Unreadable):
        return message
    return {"op": Op.ANSWER, "id": None, **_messages.failure(
        message.error, message="its answer cannot be unpickled in the leader: "
        f"{_messages.text_of(message.error)}")}
