"""``rankguard.Pool``: a leader in the caller's process and ``replicas`` replicas (each N rank
processes that form one gloo process group, ``serving.replica``) that run calls at the same
time, one each, with warm spare replicas that take over after a fault.

The leader never takes part in a collective and never waits without a deadline: a call returns,
or raises a :class:`rankguard.PoolError`, within its timeout plus about 0.1 s, whatever the ranks
do. The call's timeout becomes a :class:`~rankguard.deadline.Deadline` once, in :meth:`Pool.run`;
that value bounds the wait for a replica, the request, and the ranks' collectives. A fault fails
only its own call. The replica that saw it is retired (regrouped in place when every rank is
alive and merely raised, killed otherwise) and a ready spare takes its place at once; a
supervisor thread keeps ``replicas + spares`` replicas started, with the user's setup done, and
backs off when start-ups keep failing. It sleeps until something happens (a replica became
ready, failed, lost a rank; a call retired one; a backoff ended): no polling tick.

Which replica takes a call is ``serving.dispatch``'s: first come, first served, and a call never
waits behind one that has run past ``suspect_after`` (a hang in the making): that replica is
drained and a ready spare serves in its place until the hung call's verdict retires it.

In the journal and in :class:`PoolStatus` a replica is still called a ``group`` (``group_start``,
``group_ready``...): those names are a documented format.

Every fault, retirement, heal and spare start is a journal event (``rankguard.journal``), and
:meth:`Pool.metrics` counts them.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from ..deadline import Deadline
from .. import proctree, stack_groups
from ..errors import PoolClosed, PoolUnavailable, RequestFailed, UsageError, shown
from ..journal import Journal
from ..options import MAX_LOCAL_RANKS, seconds, writable_file
from .budgets import (BACKOFF_FIRST_S, MIN_CALL_FRACTION, REGROUP_MARGIN_S, REGROUP_S,
                      STACKS_S, SUSPECT_FRACTION)
from .dispatch import Dispatch
from ..supervisor.zygote import Zygote, ZygoteUnavailable
from . import leader_env
from .replica import WORKER_MODULE, Replica, StartFailure, cold_start

HEALING_MODES = ("wait", "fail")
FAILED_AFTER = 3  # start-ups failing in a row (a rank died, or was late) before calls fail fast
CLOSE_JOIN_S = 1.0  # at close, how long past its timeout the leader waits for the replicas
ZYGOTE_TOKEN_VAR = "RANKGUARD_ZYGOTE_TOKEN"  # in the zygote's environ, and so in /proc of its forks
ZYGOTE_TRIES = 3  # zygotes that may fail (die, stop answering) before ranks start cold only
FORK_S = 2.0  # how long a zygote may take to fork a rank (it answers in milliseconds)
QUEUE_PER_REPLICA = 32  # the default bound on the calls waiting for a replica, per replica
MAX_QUEUE = 10_000  # calls that may wait at most, whatever max_queue asks


@dataclass(frozen=True)
class PoolStatus:
    """Where a pool stands.

    Attributes:
        state: ``ready`` (a healthy replica serves calls, or is idle), ``starting`` (the first
            replica is not ready yet), ``healing`` (faults retired every replica; the next one
            is starting), ``failed`` (the setup raised, or start-ups failed 3 times in a row;
            see ``last_start_failure``; start-ups go on, with backoff) or ``closed``.
        spares_ready: ready replicas beyond those that can take a call now.
        spares_starting: replicas starting (their ranks being started, or their setup
            running).
        last_start_failure: why the last start-up failed, or None.
        idle: replicas that can take a call now (ready, running none, within ``replicas``).
        serving: replicas running a call, suspects included.
        suspect: replicas whose call has run past ``suspect_after`` (drained).
        waiting: calls waiting for a replica.
        replicas: how many replicas serve at once (the pool's ``replicas``).
    """

    state: str
    spares_ready: int
    spares_starting: int
    last_start_failure: str | None
    idle: int = 0
    serving: int = 0
    suspect: int = 0
    waiting: int = 0
    replicas: int = 1


class _Start(NamedTuple):
    """A replica the supervisor is to start: its number, and whether from the zygote."""

    number: int
    fork: bool


class Abandon:
    """What a caller sets to give up a call of :meth:`Pool.run` (``abandon=``) whose client is
    gone: a call still waiting for a replica stops waiting at once, and raises
    ``PoolUnavailable("abandoned")``; a call already running on a replica runs on (its ranks
    are mid-collective), and its replica serves again when it is done. Thread-safe."""

    def __init__(self) -> None:
        self._set = False
        self._cond: threading.Condition | None = None  # the pool's, while the call waits

    def set(self) -> None:
        self._set = True
        cond = self._cond
        if cond is not None:
            with cond:
                cond.notify_all()

    def is_set(self) -> bool:
        return self._set


class Pool:
    """Replicas of ``world_size`` rank processes that run calls, one each, and their spares;
    see the module docstring.

    Args:
        world_size: ranks per replica (each call runs on all of them).
        setup: ``setup(rank, world_size) -> state``, run once in every rank of every replica
            (spares included, ahead of time) after its gloo group formed: load a model,
            allocate buffers. Its result is the first argument of every call's function. Must
            be importable by name (a module-level function).
        spares: spare replicas kept ready beside the serving ones (0: heal from a cold start).
        timeout: default deadline of a call, in seconds. A tenth of it is the least time a
            call must have left to start on a replica (``min_call_s``).
        replicas: how many replicas serve calls at the same time (one call each).
        suspect_after: seconds after which a call still running makes its replica a suspect:
            drained, and no longer counted against ``replicas``, so that a spare serves in its
            place (default: a fifth of ``timeout``). At most ``timeout``.
        max_queue: how many calls may wait for a replica; one more fails at once with
            ``PoolUnavailable("busy")`` (default: 32 per replica).
        zygote: start ranks by forking a zygote process that imported torch and the rank's
            code once (milliseconds per rank, instead of seconds for a new Python); False:
            each rank is a new Python. A zygote that fails is replaced, and after 3 failures
            ranks start cold.
        on_healing: ``wait``: a call that arrives while no replica is ready waits for one
            within its deadline; ``fail``: it raises :class:`PoolUnavailable` at once.
        start_timeout: seconds a replica may take to start (torch import, setup).
        max_backoff: the longest pause, in seconds, between start-ups that keep failing.
        journal: path of a JSON-lines journal to append events to (default: none).
        log_dir: where each rank's output and stacks go (default: a new temporary folder,
            removed when the pool closes).
        env: extra environment variables for the ranks.
        wait: wait (bounded by ``start_timeout``) until the first replica is ready.

    Raises:
        UsageError: a bad argument.
        PoolUnavailable: ``wait`` and the first replica failed to start (``state ==
            "failed"``: the setup failed, or a rank died) or was not ready within
            ``start_timeout``.
    """

    def __init__(self, world_size: int, setup: Callable[[int, int], Any] | None = None, *,
                 spares: int = 1, timeout: float = 30.0, replicas: int = 1,
                 suspect_after: float | None = None, max_queue: int | None = None,
                 on_healing: str = "wait", start_timeout: float = 120.0,
                 max_backoff: float = 30.0, journal: str | None = None,
                 log_dir: str | None = None, env: dict[str, str] | None = None,
                 zygote: bool = True, wait: bool = True) -> None:
        check_size(world_size, spares, replicas)
        if not isinstance(zygote, bool):
            raise UsageError("Pool(zygote)", f"expected True or False, got {shown(zygote)}")
        self.timeout = seconds("Pool(timeout)", timeout)
        self.suspect_after = self.timeout * SUSPECT_FRACTION if suspect_after is None else \
            seconds("Pool(suspect_after)", suspect_after)
        if self.suspect_after > self.timeout:
            raise UsageError("Pool(suspect_after)", f"{self.suspect_after:g} s is longer than "
                             f"the pool's timeout of {self.timeout:g} s",
                             "give at most the timeout")
        self.max_queue = QUEUE_PER_REPLICA * replicas if max_queue is None else \
            _whole_number("Pool(max_queue)", max_queue, 0)
        if self.max_queue > MAX_QUEUE:
            raise UsageError("Pool(max_queue)", f"{shown(self.max_queue)} is above {MAX_QUEUE}",
                             "each waiting call holds a thread (rankguard serve's, or the "
                             "caller's): queue at most that many")
        self.start_timeout = seconds("Pool(start_timeout)", start_timeout)
        self.max_backoff = seconds("Pool(max_backoff)", max_backoff)
        # rounded: 3 s x 0.1 is 0.30000000000000004, and a deadline of 0.3 s must be allowed
        self.min_call_s = round(self.timeout * MIN_CALL_FRACTION, 9)
        if on_healing not in HEALING_MODES:
            raise UsageError("Pool(on_healing)", f"{on_healing!r} is not one of "
                             f"{', '.join(HEALING_MODES)}")
        if setup is not None and not callable(setup):
            raise UsageError("Pool(setup)", f"{setup!r} is not callable")
        self.world_size = world_size
        self.spares = spares
        self.replicas = replicas
        self.zygote = zygote
        self.on_healing = on_healing
        self._setup = setup
        self._env = dict(env or {})
        self.id = f"pool-{uuid.uuid4().hex[:8]}"
        self._journal = _open_journal(journal, self.id) if journal else None
        self._own_log_dir = not log_dir  # a folder of ours, removed by close()
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="rankguard-pool-")
        self._cond = threading.Condition()
        self._dispatch: Dispatch[Replica] = Dispatch(replicas, self.suspect_after)
        self._starting: list[Replica] = []
        self._retired: list[Replica] = []  # regrouping in the background
        self._numbers = 0
        self._closed = False
        self._closed_until = Deadline.never()  # set by close(): when what is left is killed,
        self._closed_join_by = Deadline.never()  # and how long the shutdown may take
        self._closed_groups = 0
        self._lost_at: list[float] = []  # when replicas were lost, until the pool is whole
        self._start_failures = 0  # consecutive
        self._last_start_failure: StartFailure | None = None
        self._next_start = Deadline.after(0.0)  # the backoff after failed start-ups
        self._start_estimate_s = 3.0
        self._zygote: Zygote | None = None
        self._zygote_by = Deadline.never()  # when a starting zygote must be ready
        self._zygote_tries = 0 if zygote else ZYGOTE_TRIES
        self._zygote_token = secrets.token_hex(8)  # marks every process forked from it
        self._creating = 0  # replicas the supervisor is creating, outside the lock
        self.counts: Counter[str] = Counter()
        self.heal_seconds: list[float] = []
        self._event("pool_start", world_size=world_size, spares=spares, replicas=replicas,
                    suspect_after=self.suspect_after, log_dir=self.log_dir)
        self._supervisor = threading.Thread(target=self._supervise, name="rankguard-pool",
                                            daemon=True)
        self._supervisor.start()
        if wait:
            try:
                self.wait_ready(self.start_timeout + 5.0)
            except PoolUnavailable:
                self.close()
                raise

    # -- calls ----------------------------------------------------------------------------------

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None,
            all_ranks: bool = False, abandon: Abandon | None = None, **kwargs: Any) -> Any:
        """Run ``fn(state, *args, **kwargs)`` on every rank; rank 0's result (a list of every
        rank's with ``all_ranks``). ``fn``, the arguments and the results are pickled; ``fn``
        must be importable by name.

        Returns or raises within ``timeout`` (default: the pool's) plus about 0.1 s, including
        any wait for the replica to be free or healed. A call waits for the replica only while
        at least ``min_call_s`` of its deadline would be left: a call that could only start
        with less fails with ``PoolUnavailable`` and never reaches the replica.

        Raises:
            RequestFailed: a rank raised, exited, was killed, froze, or was still running at
                the deadline while its peers waited for it; names the rank and the cause. When
                the call's own deadline passed with every rank still running it and none behind
                the others, ``rank`` is None (cause ``deadline``): the replica finishes the call
                and serves again. The pool heals by itself.
            PoolUnavailable: no healthy replica in time (``healing``, ``busy``), or at once
                with ``on_healing="fail"`` or when start-ups keep failing (``failed``), or
                ``abandon`` was set while the call waited (``abandoned``).
            PoolClosed: the pool was closed.
            UsageError: ``timeout`` is not a finite number of seconds of at least
                ``min_call_s``, or the call cannot be pickled.
        """
        limit = self.timeout if timeout is None else self.call_timeout("Pool.run(timeout)",
                                                                       timeout)
        started = time.monotonic()
        deadline = Deadline.after(limit)  # the call's one deadline, down to the ranks
        replica = self._claim(deadline, abandon)
        command = {"fn": fn, "args": args, "kwargs": kwargs, "all": all_ranks}
        try:
            results = replica.run(command, started, deadline)
        except RequestFailed as fault:
            if self._closed and replica.killed:  # the close ended the ranks: no rank's fault
                with self._cond:
                    self.counts["requests_closed"] += 1
                raise PoolClosed(f"the pool was closed during the call, after {fault.took:.2f} "
                                 "s: its ranks were stopped before they finished it") from fault
            self._on_fault(replica, fault)
            raise
        except UsageError:
            self._release(replica, succeeded=False)
            raise  # nothing was sent
        except BaseException:  # interrupted (KeyboardInterrupt...): the ranks are mid-request
            self._on_fault(replica, RequestFailed(None, "deadline", "was interrupted in the "
                                                  "leader", took=time.monotonic() - started),
                           interrupted=True)
            raise
        self._release(replica, succeeded=True)
        self._event("request", group=replica.number, took_s=round(time.monotonic() - started, 6))
        return [results[r] for r in range(self.world_size)] if all_ranks else results[0]

    def _release(self, replica: Replica, succeeded: bool) -> None:
        """The call on ``replica`` ended without a fault: it serves again."""
        with self._cond:
            ran = self._dispatch.done(replica)
            if succeeded:
                self.counts["requests_ok"] += 1
                if ran is not None and ran > self.suspect_after:
                    self.counts["slow_calls"] += 1  # a suspect that was merely slow
            self._cond.notify_all()

    def call_timeout(self, what: str, value: object) -> float:
        """``value`` as a call's deadline in seconds: finite and at least ``min_call_s``.

        Raises:
            UsageError: naming ``what``.
        """
        limit = seconds(what, value)
        if limit < self.min_call_s:
            raise UsageError(what, f"{limit:g} s is below the least useful deadline of "
                             f"{self.min_call_s:g} s (a tenth of the pool's timeout)",
                             f"give at least {self.min_call_s:g} s")
        return limit

    def _claim(self, deadline: Deadline, abandon: Abandon | None = None) -> Replica:
        """A replica for the call, marked busy: at once if one is free and no older call waits;
        else the call queues (at most ``max_queue`` calls do) and waits, bounded, but only until
        ``min_call_s`` before ``deadline``: a call that could start only later fails as
        unavailable, and no replica is touched."""
        latest = deadline.before(self.min_call_s)
        with self._cond:
            if self._closed:
                self.counts["requests_closed"] += 1
                raise PoolClosed("the pool was closed")
            if self._dispatch.waiting() >= self.max_queue + self._dispatch.free():
                self.counts["requests_unavailable"] += 1
                raise PoolUnavailable("busy", 1.0, f"{self._dispatch.waiting()} calls wait for "
                                      f"a replica already (max_queue={self.max_queue})")
            ticket = self._dispatch.enqueue()
            if abandon is not None:
                abandon._cond = self._cond
            first = True  # a free replica is taken at once (the deadline was checked on entry)
            try:
                while True:
                    if self._closed:
                        self.counts["requests_closed"] += 1
                        raise PoolClosed("the pool was closed")
                    if abandon is not None and abandon.is_set():
                        self.counts["requests_abandoned"] += 1
                        raise PoolUnavailable("abandoned", 0.0, "the caller gave the call up "
                                              "while it waited for a replica")
                    now = time.monotonic()
                    for suspect in self._dispatch.newly_suspect(now):
                        self.counts["suspicions"] += 1
                        self._event("group_suspect", group=suspect.number,
                                    running_s=round(now - self._dispatch.busy[suspect], 3))
                    if (first or not latest.passed()) and self._dispatch.can_take(ticket, now):
                        replica = self._dispatch.take(ticket)
                        ticket = None
                        return replica
                    state = self._state()
                    if state == "failed" or (state == "healing" and self.on_healing == "fail"):
                        self.counts["requests_unavailable"] += 1
                        raise self._unavailable(state)
                    if latest.passed():
                        self.counts["requests_unavailable"] += 1
                        raise self._unavailable("busy" if self._dispatch.healthy() else state)
                    wake = self._dispatch.next_suspicion(now)
                    self._cond.wait(latest.wait_time() if wake is None else
                                    min(wake, latest.wait_time()))
                    first = False
            finally:
                if abandon is not None:
                    abandon._cond = None
                if ticket is not None:
                    self._dispatch.leave(ticket)
                    self._cond.notify_all()  # a younger call may be first now

    def _unavailable(self, state: str) -> PoolUnavailable:
        if state == "failed":
            failure = self._last_start_failure
            detail = (f"{self._start_failures} start-up(s) in a row failed; the last: "
                      f"{failure.describe() if failure else '?'}; next try in "
                      f"{self._next_start.left():.1f} s")
            return PoolUnavailable("failed", self._next_start.left(1.0), detail)
        if state == "busy":
            return PoolUnavailable("busy", 1.0, "the replicas ran other calls until less than "
                                   f"{self.min_call_s:g} s of this call's deadline was left")
        return PoolUnavailable(state, self._start_estimate_s,
                               "faults retired every replica; a new one is starting"
                               if state == "healing" else "the first replica is starting")

    def _on_fault(self, replica: Replica, fault: RequestFailed, interrupted: bool = False
                  ) -> None:
        """Retire ``replica`` after ``fault``: regrouped in place when its ranks only raised,
        or when the call merely overran its own deadline (once they finish it); killed
        otherwise, after its stacks for a hang (or when the leader was interrupted
        mid-call)."""
        with self._cond:
            self.counts["requests_failed"] += 1
            self.counts[f"faults_{fault.cause}"] += 1
        self._event("request_fault", group=replica.number, rank=fault.rank, cause=fault.cause,
                    detail=fault.detail, victims=fault.victims, took_s=round(fault.took, 4))
        idle = fault.cause == "raised" and replica.alive()
        overran = fault.cause == "deadline" and fault.rank is None and not interrupted
        with self._cond:
            self._lose(replica)
            self._event("group_retire", group=replica.number,
                        action="regroup" if idle or overran else "kill", reason=fault.cause)
            if idle or overran:
                self._retired.append(replica)
                threading.Thread(target=self._settle_then_regroup if overran else self._regroup,
                                 args=(replica,), daemon=True, name="rankguard-regroup").start()
            elif fault.cause in ("frozen", "deadline"):
                threading.Thread(target=self._stacks_then_kill, args=(replica,), daemon=True,
                                 name="rankguard-stacks").start()
            else:
                replica.kill()
            self._count_heals()
            self._cond.notify_all()

    def _lose(self, replica: Replica) -> None:
        """Under the lock: ``replica`` no longer serves; the pool heals from that moment."""
        if self._dispatch.remove(replica):
            self._lost_at.append(time.monotonic())

    def _count_heals(self) -> None:
        """Under the lock: each loss of a replica is healed once ``replicas`` healthy replicas
        serve again (at once when a spare was ready)."""
        while self._lost_at and self._dispatch.healthy() >= self.replicas and not self._closed:
            took = time.monotonic() - self._lost_at.pop(0)
            self.heal_seconds.append(took)
            self.counts["heals"] += 1
            self._event("heal", healthy=self._dispatch.healthy(), took_s=round(took, 4))

    def _stacks_then_kill(self, replica: Replica) -> None:
        """After a hang verdict: where each rank was stuck goes to the journal, then the
        replica is killed (the call already failed; this does not delay it). The ranks get as
        long to answer as a call gets to run (at least ``STACKS_S``): on a loaded machine a
        second was not always enough; the wait ends as soon as every rank has answered."""
        try:
            dumps = replica.capture_stacks(Deadline.after(max(STACKS_S, self.timeout)))
            self._event("stacks", group=replica.number,
                        stacks={rank: replica.stacks_path(rank) for rank in dumps},
                        grouped=stack_groups.describe(
                            stack_groups.group(dumps, sorted(dumps)), ""))
        finally:
            replica.kill()

    def _settle_then_regroup(self, replica: Replica) -> None:
        """A replica whose call overran the call's own deadline, every rank still running it:
        once every rank has finished that call (within the pool's timeout) it regroups and
        serves again; a rank that does not finish by then gets the hang treatment."""
        if not self._closed and replica.settle(Deadline.after(self.timeout)):
            self._regroup(replica)
            return
        with self._cond:
            self._retired.remove(replica)
            self._cond.notify_all()
        self._stacks_then_kill(replica)

    def _regroup(self, replica: Replica) -> None:
        """A replica whose ranks only raised forms a fresh generation and becomes a spare
        again."""
        ok = replica.regroup(Deadline.after(REGROUP_S + REGROUP_MARGIN_S))
        with self._cond:
            self._retired.remove(replica)
            if ok and not self._closed:
                self._dispatch.add(replica)
                self._event("group_ready", group=replica.number, role="regrouped")
                self._count_heals()
            else:
                replica.kill()
            self._cond.notify_all()

    # -- the supervisor: spares, start-ups, backoff ---------------------------------------------

    def _supervise(self) -> None:
        """Until the pool closes: take in what changed, start what is missing, and sleep until
        the next change (``_changed``, or any ``notify_all``) or the end of a backoff. Then
        shut the replicas down, here: the ranks die with the thread that started them
        (PR_SET_PDEATHSIG follows the thread, not the process), so this thread must outlive
        them, or a close would SIGKILL them at once, mid-call and without their shutdown."""
        while True:
            with self._cond:
                if self._closed:
                    break
                self._check_starting()
                self._check_idle()
                plan = self._plan()
                if not isinstance(plan, _Start):
                    self._cond.wait(plan)
                    continue
                self._creating += 1
            # outside the lock: starting ranks takes a while (the first store imports torch,
            # a fork waits for the zygote), and calls, probes and metrics must not wait for it
            replica = self._create(plan)
            with self._cond:
                self._creating -= 1
                if replica is not None:
                    self._starting.append(replica)
                    self._event("group_start", group=replica.number, pids=replica.pids)
                self._cond.notify_all()
        self._shut_down()

    def _changed(self) -> None:
        """A replica became ready, failed to start, or lost a rank (from its watcher)."""
        with self._cond:
            self._cond.notify_all()

    def _check_starting(self) -> None:
        for replica in list(self._starting):
            state = replica.start_state()
            if state == "starting":
                continue
            self._starting.remove(replica)
            if state == "ready":
                took = (replica.ready_at or time.monotonic()) - replica.started_at
                self._start_estimate_s = took
                self._start_failures = 0
                self._last_start_failure = None
                self._dispatch.add(replica)
                self._event("group_ready", group=replica.number, role="started",
                            took_s=round(took, 3))
                self._count_heals()
            else:
                replica.kill()
                self._start_failed(replica.number, replica.failure or StartFailure(None, "failed"))
            self._cond.notify_all()

    def _start_failed(self, number: int, failure: StartFailure) -> None:
        """Under the lock: replica ``number`` did not start; the next try waits a backoff."""
        self._start_failures += 1
        self._last_start_failure = failure
        pause = min(self.max_backoff, BACKOFF_FIRST_S * 2 ** (self._start_failures - 1))
        self._next_start = Deadline.after(pause)
        self.counts["start_failures"] += 1
        self._event("group_start_failed", group=number, rank=failure.rank,
                    detail=failure.detail, traceback=failure.remote_traceback,
                    consecutive=self._start_failures, backoff_s=pause)

    def _check_idle(self) -> None:
        for replica in list(self._dispatch.ready):
            if not replica.alive():
                self._lose(replica)
                replica.kill()
                self._event("group_retire", group=replica.number, action="kill",
                            reason="a rank of an idle replica died")
        self._count_heals()

    def _plan(self) -> _Start | float | None:
        """Under the lock: the replica to start next, if one is missing and no backoff holds it
        back; else how long the supervisor may sleep before it must look again (None: until
        something changes)."""
        wanted = self.replicas + self.spares
        have = self._dispatch.healthy() + len(self._starting) + len(self._retired) + \
            self._creating
        if have >= wanted:
            return None
        if (self._starting or self._creating) and self._start_failures:
            return None  # failing: one attempt at a time
        if not self._next_start.passed():
            return self._next_start.wait_time()
        waiting = self._zygote_waits()
        if waiting is not None:
            return waiting
        self._numbers += 1
        return _Start(self._numbers, self._zygote is not None and self._zygote.ready)

    def _create(self, start: _Start) -> Replica | None:
        """Not under the lock: the replica ``start`` describes, starting; None if its ranks
        could not even be started (no file descriptor, no memory...): a failed start-up."""
        try:
            replica = Replica(start.number, self.world_size, self._setup,
                              os.path.join(self.log_dir, f"group{start.number}"), self._env,
                              Deadline.after(self.start_timeout), self._changed,
                              self._fork_rank if start.fork else None)
        except Exception as error:  # noqa: BLE001 (no descriptor, no memory, the store's
            # "Failed to init uv loop"...: whatever it is, a start-up that failed, retried with
            # backoff; the supervisor must not die of it)
            with self._cond:
                self._start_failed(start.number, StartFailure(
                    None, f"could not be started: {getattr(error, 'strerror', None) or error}"))
            return None
        with self._cond:
            if self._closed:
                replica.kill()
                return None
        return replica

    # -- the zygote -----------------------------------------------------------------------------

    def _zygote_waits(self) -> float | None:
        """Under the lock, in the supervisor: start a zygote if there should be one; how long
        to wait for it before starting a replica (None: start now, forked or cold)."""
        zygote = self._zygote
        if zygote is None:
            if self._zygote_tries >= ZYGOTE_TRIES:
                return None  # cold starts only
            self._zygote_tries += 1
            env = {**os.environ, **leader_env.leader_context(), **self._env,
                   "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                   ZYGOTE_TOKEN_VAR: self._zygote_token}
            try:
                os.makedirs(self.log_dir, exist_ok=True)
                self._zygote = Zygote(["torch", "torch.distributed", WORKER_MODULE], env,
                                      os.path.join(self.log_dir, "zygote.log"), self._changed)
            except Exception as error:  # noqa: BLE001 (see _create): ranks start cold
                self._zygote_tries = ZYGOTE_TRIES
                self.counts["zygote_failures"] += 1
                self._event("zygote_failed", pid=None, detail=f"it could not start: {error}",
                            cold=True)
                return None
            self._zygote_by = Deadline.after(self.start_timeout)
            self._event("zygote_start", pid=self._zygote.proc.pid)
            return self._zygote_by.wait_time()
        if zygote.ready:
            return None
        if zygote.gone or self._zygote_by.passed():
            self._zygote_failed(("it died" if zygote.imported else "it died while importing")
                                if zygote.gone else
                                f"it was not ready within {self.start_timeout:g} s")
            return 0.0
        return self._zygote_by.wait_time()

    def _zygote_failed(self, why: str) -> None:
        """Under the lock: drop the zygote (killed, with the ranks it forked that still run);
        the next start-up makes a new one, or after ZYGOTE_TRIES starts ranks cold."""
        zygote, self._zygote = self._zygote, None
        if zygote is None:
            return
        zygote.proc.kill()
        self.counts["zygote_failures"] += 1
        self._event("zygote_failed", pid=zygote.proc.pid, detail=why,
                    cold=self._zygote_tries >= ZYGOTE_TRIES)
        threading.Thread(target=zygote.close, args=(Deadline.after(0.0),), daemon=True,
                         name="rankguard-zygote-reap").start()

    def _fork_rank(self, env: dict[str, str], log: str, channel_fd: int) -> Any:
        """A replica's rank, forked by the zygote (cold when the zygote fails: it is dropped)."""
        zygote = self._zygote
        if zygote is not None:
            try:
                return zygote.fork(WORKER_MODULE, {**env, leader_env.LEADER: str(zygote.proc.pid)},
                                   log, {leader_env.FD: channel_fd}, Deadline.after(FORK_S))
            except ZygoteUnavailable as error:
                with self._cond:
                    if self._zygote is zygote:
                        self._zygote_failed(str(error))
        return cold_start(env, log, channel_fd)

    # -- state ------------------------------------------------------------------------------------

    def _state(self) -> str:
        if self._closed:
            return "closed"
        if self._dispatch.healthy():
            return "ready"
        failure = self._last_start_failure
        if failure is not None and (failure.remote_traceback or
                                    self._start_failures >= FAILED_AFTER):
            return "failed"  # the setup raised, or start-ups keep failing
        return "healing" if self._lost_at else "starting"

    def status(self) -> PoolStatus:
        with self._cond:
            failure = self._last_start_failure
            state = self._state()
            now = time.monotonic()
            serving = state == "ready"
            return PoolStatus(state, self._dispatch.spares(now) if serving else 0,
                              len(self._starting) + self._creating,
                              failure.describe() if failure else None,
                              idle=self._dispatch.free(now) if serving else 0,
                              serving=len(self._dispatch.busy),
                              suspect=len(self._dispatch.suspects(now)),
                              waiting=self._dispatch.waiting(), replicas=self.replicas)

    def wait_ready(self, timeout: float) -> None:
        """Wait until a replica serves calls.

        Raises:
            PoolUnavailable: start-up failed (``failed``) or ``timeout`` passed.
            PoolClosed: the pool was closed.
        """
        until = Deadline.after(timeout)
        with self._cond:
            while not self._dispatch.healthy():
                if self._closed:
                    raise PoolClosed("the pool was closed")
                state = self._state()
                if state == "failed":
                    raise self._unavailable(state)
                if until.passed():
                    raise PoolUnavailable(state, self._start_estimate_s,
                                          f"no replica was ready within {timeout:g} s")
                self._cond.wait(until.wait_time())

    def heal_durations(self) -> list[float]:
        """Seconds each heal took, from losing the serving replica to a new one serving."""
        with self._cond:
            return list(self.heal_seconds)

    def metrics(self) -> dict[str, float]:
        """Counters and gauges: requests by outcome, faults by cause, heals and their time,
        start-up failures, spares."""
        with self._cond:
            values: dict[str, float] = dict(self.counts)
            values["spares_ready"] = self._dispatch.spares()
            values["spares_starting"] = len(self._starting) + self._creating
            values["serving"] = len(self._dispatch.busy)
            values["heal_seconds_sum"] = sum(self.heal_seconds)
            values["heal_seconds_count"] = len(self.heal_seconds)
            return values

    def _event(self, name: str, **fields: Any) -> None:
        if self._journal is not None:
            self._journal.write(name, **fields)

    # -- the end ----------------------------------------------------------------------------------

    def close(self, timeout: float = 5.0) -> None:
        """Stop the supervisor and shut every replica down: the serving replica and the
        spares get a bounded barrier and exit; whatever is left after ``timeout`` is killed. A
        call still running then raises :class:`PoolClosed`. The log folder goes too when the
        pool made it (no ``log_dir`` was given). Returns within ``timeout`` plus about
        ``CLOSE_JOIN_S``. Idempotent: a second call waits for the first one's shutdown (bounded
        by its own ``timeout``)."""
        joined_by = Deadline.after(timeout + CLOSE_JOIN_S)
        with self._cond:
            first = not self._closed
            if first:
                self._closed = True
                self._closed_until = Deadline.after(timeout)
                self._closed_join_by = joined_by
                self._cond.notify_all()
        self._supervisor.join(joined_by.timeout())
        if not first:
            return
        self._event("pool_close", groups=self._closed_groups)
        # events of background threads that end later go nowhere, not to a closed file
        journal, self._journal = self._journal, None
        if journal is not None:
            journal.close()
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def _shut_down(self) -> None:
        """The supervisor's last act, once the pool is closed: kill the replicas that were
        starting or regrouping, and close the others (a bounded barrier, then a kill at the
        close's deadline), all at once."""
        with self._cond:
            until, joined_by = self._closed_until, self._closed_join_by
            replicas = self._dispatch.clear()
            doomed = self._starting + self._retired
            self._starting = []
            self._closed_groups = len(replicas) + len(doomed)
        for replica in doomed:
            replica.kill()
        closers = [threading.Thread(target=r.close, args=(until,), daemon=True)
                   for r in replicas]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(joined_by.timeout())
        if self._zygote is not None:
            self._zygote.close(until)
        if self.zygote:  # what the ranks forked without exec shows the zygote's environ
            proctree.kill_all(proctree.with_env(ZYGOTE_TOKEN_VAR, self._zygote_token))

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _open_journal(path: str, pool_id: str) -> Journal:
    try:
        return Journal(writable_file("Pool(journal)", path), pool_id)
    except OSError as error:
        raise UsageError("Pool(journal)", f"cannot open {path!r}: {error.strerror}",
                         "choose a file you can write to") from None


def check_size(world_size: Any, spares: Any, replicas: Any = 1,
               names: tuple[str, str, str] = ("Pool(world_size)", "Pool(spares)",
                                              "Pool(replicas)")) -> None:
    """Refuse a pool size that is not whole numbers (``world_size`` >= 1, ``spares`` >= 0,
    ``replicas`` >= 1), or whose ``world_size * (replicas + spares)`` rank processes exceed
    ``MAX_LOCAL_RANKS`` on this machine; ``names``: how the caller calls the three
    (``--world-size``, ``--spares``, ``--replicas``).

    Raises:
        UsageError: naming the value and the fix.
    """
    for what, value, least in ((names[0], world_size, 1), (names[1], spares, 0),
                               (names[2], replicas, 1)):
        _whole_number(what, value, least)
        if value > MAX_LOCAL_RANKS:
            raise UsageError(what, f"{shown(value)} is above {MAX_LOCAL_RANKS}",
                             f"start at most {MAX_LOCAL_RANKS} rank processes on one machine")
    groups = replicas + spares
    if world_size * groups > MAX_LOCAL_RANKS:
        raise UsageError(f"{names[0]}, {names[1]} and {names[2]}",
                         f"{world_size} ranks per replica x {groups} replicas ({replicas} "
                         f"serving and {spares} spare(s)) is more than {MAX_LOCAL_RANKS} rank "
                         "processes", f"start at most {MAX_LOCAL_RANKS} rank processes on one "
                         "machine")


def _whole_number(what: str, value: Any, least: int) -> int:
    """``value`` if it is an int (not a bool) of at least ``least``.

    Raises:
        UsageError: naming ``what``.
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise UsageError(what, f"expected a whole number >= {least}, got {shown(value)}")
    return value
