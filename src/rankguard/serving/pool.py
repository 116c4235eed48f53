"""``rankguard.Pool``: a leader in the caller's process and ``replicas`` replicas (each N rank
processes that form one process group, ``serving.replica``: gloo, or NCCL on the devices
``serving.placement`` gives them) that run calls at the same time, one each, with warm spare
replicas that take over after a fault.

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

Every process the pool starts, and whatever those start, carries the pool's marker (``MARKER``)
in its environment: should the caller's process die without :meth:`Pool.close` (a SIGKILL, an
exit that skipped it), the pool's guardian (``supervisor.guardian``) kills them all and removes
the pool's temporary log folder.

This module is the calls' side: the options are checked once into a ``PoolOptions``
(``serving.pool_options``); the replicas, by stage, and the counts live in a ``ReplicaSet``
(``serving.replica_set``) under the pool's one lock; the supervisor thread is a
``ReplicaKeeper`` (``serving.replica_keeper``), which starts replicas with a ``StartBackoff``
(``serving.backoff``) from a ``PoolZygote`` (``serving.pool_zygote``) and retires them after
faults; the state is ``serving.pool_state``'s.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections import Counter
from typing import Any, Callable

from ..deadline import MAX_SECONDS, Deadline, check_seconds
from ..errors import (PoolClosed, PoolUnavailable, RequestCause, RequestFailed,
                      UnavailableState, UsageError, shown)
from ..records import private_files
from ..records.journal import Journal
from ..inputs.options import seconds, writable_file
from ..supervisor.guardian import Guardian
from .budgets import CALL_HANDOFF_S
from .dispatch import Dispatch
from .pool_options import HealingMode, PoolOptions
from .pool_state import PoolState, PoolStatus
from .replica import Replica
from .replica_keeper import ReplicaKeeper
from .replica_set import ReplicaSet

__all__ = ["Abandon", "Pool", "PoolStatus", "CLOSE_JOIN_S"]

MARKER = "RANKGUARD_POOL_TOKEN"  # in every process of the pool's and what those start
CLOSE_JOIN_S = 1.0  # at close, how long past its timeout the leader waits for the replicas


class Abandon:
    """What a caller sets to give up a call of :meth:`Pool.run` (``abandon=``) whose client is
    gone: a call still waiting for a replica stops waiting at once, and raises
    ``PoolUnavailable("abandoned")``; a call already running on a replica runs on (its ranks
    are mid-collective), and its replica serves again when it is done. Thread-safe."""

    def __init__(self) -> None:
        self._set = False
        self._wake: Callable[[], None] | None = None  # the pool's, while the call waits

    def set(self) -> None:
        self._set = True
        wake = self._wake
        if wake is not None:
            wake()

    def is_set(self) -> bool:
        return self._set

    def wake_on_set(self, wake: Callable[[], None] | None) -> None:
        """While the call waits: :meth:`set` calls ``wake`` (None: no longer)."""
        self._wake = wake


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
        journal: path of a JSON-lines journal to append events to (default: none); a
            symlink, a file of another user's or a hard link found there is refused.
        log_dir: where each rank's output and stacks go (default: a new temporary folder,
            removed when the pool closes); a folder of this user's that other users cannot
            write (its group may).
        env: extra environment variables for the ranks.
        devices: the CUDA device of each rank: ``[0, 1]`` puts rank r of every replica on
            device ``devices[r]``; ``[[0, 1], [2, 3]]`` gives one list per replica, spares
            included. The replicas then form NCCL groups; each rank's device is its current
            CUDA device before its group forms and its setup runs (:func:`rankguard.device`).
            Ranks of a replica may share a device. Default: the CPU, over gloo.
        gpus_per_replica: instead of ``devices``: each replica, spares included, gets this
            many CUDA devices of its own, in order, its ranks spread over them (at most
            ``world_size``; more devices than visible is refused).
        warm_spares: rank processes kept ready on each device the replicas use (torch
            imported; on a GPU, CUDA initialised and its context made), each taking an
            unusable rank's place when a replica heals (default: 1 per device on GPUs, where
            a rank forked from the zygote still makes its CUDA context; 0 on the CPU, where a
            forked rank starts in milliseconds). They start once every replica serves.
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
                 zygote: bool = True, devices: list[int] | list[list[int]] | None = None,
                 gpus_per_replica: int | None = None, warm_spares: int | None = None,
                 wait: bool = True) -> None:
        self.options = PoolOptions.checked(
            world_size, setup, spares=spares, timeout=timeout, replicas=replicas,
            suspect_after=suspect_after, max_queue=max_queue, on_healing=on_healing,
            start_timeout=start_timeout, max_backoff=max_backoff, journal=journal,
            log_dir=log_dir, env=env, zygote=zygote, devices=devices,
            gpus_per_replica=gpus_per_replica, warm_spares=warm_spares)
        options = self.options
        self.id = f"pool-{uuid.uuid4().hex[:8]}"
        self._journal = _open_journal(options.journal, self.id) if options.journal else None
        self._own_log_dir = options.log_dir is None  # a folder of ours, removed by close()
        self.log_dir = options.log_dir or tempfile.mkdtemp(prefix="rankguard-pool-")
        token = uuid.uuid4().hex
        self._guardian = Guardian(MARKER, token, [self.log_dir] if self._own_log_dir else [])
        self._set = ReplicaSet(options.replicas, options.suspect_after, options.max_backoff,
                               self._event)
        self._keeper = ReplicaKeeper(options, self.log_dir, self._set, self._event,
                                     {MARKER: token})
        self._event("pool_start", world_size=world_size, spares=spares, replicas=replicas,
                    suspect_after=options.suspect_after, log_dir=self.log_dir,
                    backend=options.backend)
        self._keeper.start()
        if wait:
            try:
                self.wait_ready(options.start_timeout + 5.0)
            except PoolUnavailable:
                self.close()
                raise

    # -- the options, as attributes -------------------------------------------------------------

    world_size = property(lambda self: self.options.world_size, doc="ranks per replica")
    spares = property(lambda self: self.options.spares, doc="spare replicas kept ready")
    replicas = property(lambda self: self.options.replicas, doc="replicas serving at once")
    timeout = property(lambda self: self.options.timeout, doc="a call's default deadline (s)")
    suspect_after = property(lambda self: self.options.suspect_after,
                             doc="seconds after which a running call's replica is a suspect")
    max_queue = property(lambda self: self.options.max_queue,
                         doc="how many calls may wait for a replica")
    on_healing = property(lambda self: self.options.on_healing,
                          doc="what a call does while no replica is ready")
    start_timeout = property(lambda self: self.options.start_timeout,
                             doc="seconds a replica may take to start")
    max_backoff = property(lambda self: self.options.max_backoff,
                           doc="the longest pause between start-ups that keep failing (s)")
    zygote = property(lambda self: self.options.zygote, doc="whether ranks are forked")
    min_call_s = property(lambda self: self.options.min_call_s,
                          doc="the least time a call must have left to start on a replica")

    @property
    def counts(self) -> Counter[str]:
        """What :meth:`metrics` counts (read it under no assumption of consistency)."""
        return self._set.counts


    @property
    def _dispatch(self) -> Dispatch[Replica]:
        return self._set.dispatch

    # -- calls ----------------------------------------------------------------------------------

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None,
            all_ranks: bool = False, abandon: Abandon | None = None,
            deadline: Deadline | None = None, **kwargs: Any) -> Any:
        """Run ``fn(state, *args, **kwargs)`` on every rank; rank 0's result (a list of every
        rank's with ``all_ranks``). ``fn``, the arguments and the results are pickled; ``fn``
        must be importable by name.

        Returns or raises within ``timeout`` (default: the pool's) plus about 0.1 s, including
        any wait for the replica to be free or healed. A call waits for the replica only while
        at least ``min_call_s`` of its deadline would be left: a call that could only start
        with less fails with ``PoolUnavailable`` and never reaches the replica. ``deadline``,
        in place of ``timeout``: the call's deadline, begun before the call (a server's, when
        the request arrived); a call that comes with less than ``min_call_s`` of it left
        (less a hand-off of at most ``CALL_HANDOFF_S``, so that a deadline of ``min_call_s``
        begun just before can start) fails at once with ``PoolUnavailable("busy")``.

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
                ``min_call_s``, ``deadline`` is not a Deadline at most ``MAX_SECONDS`` away
                (``Deadline.never()``), or the call cannot be pickled.
        """
        options = self.options
        if deadline is None:
            limit = options.timeout if timeout is None else self.call_timeout(
                "Pool.run(timeout)", timeout)
            deadline = Deadline.after(limit)  # the call's one deadline, down to the ranks
        elif not isinstance(deadline, Deadline) or not deadline.remaining() <= MAX_SECONDS:
            raise UsageError("Pool.run(deadline)", f"expected a rankguard Deadline at most "
                             f"{MAX_SECONDS:g} s away, got {shown(deadline)}",
                             "give Deadline.after(seconds), or timeout=seconds")
        elif deadline.remaining() < options.min_call_s - min(CALL_HANDOFF_S,
                                                              options.min_call_s / 2):
            with self._set.cond:
                self._set.counts["requests_unavailable"] += 1
            raise PoolUnavailable(UnavailableState.BUSY, 1.0, f"only "
                                  f"{max(0.0, deadline.remaining()):.3f} s of the call's "
                                  f"deadline of {deadline.seconds:g} s was left when it came, "
                                  f"less than min_call_s ({options.min_call_s:g} s)")
        started = deadline.at - deadline.seconds
        replica = self._claim(deadline, abandon)
        command = {"fn": fn, "args": args, "kwargs": kwargs, "all": all_ranks,
                   "keep_group": True}
        try:
            results = replica.run(command, started, deadline)
        except RequestFailed as fault:
            if self._set.closed and replica.killed:  # the close ended the ranks: no rank's fault
                with self._set.cond:
                    self._set.counts["requests_closed"] += 1
                raise PoolClosed(f"the pool was closed during the call, after {fault.took:.2f} "
                                 "s: its ranks were stopped before they finished it") from fault
            self._on_fault(replica, fault)
            raise
        except UsageError:
            self._release(replica, succeeded=False)
            raise  # nothing was sent
        except BaseException:  # interrupted (KeyboardInterrupt...): the ranks are mid-request
            self._on_fault(replica, RequestFailed(None, RequestCause.DEADLINE, "was interrupted "
                                                  "in the leader",
                                                  took=time.monotonic() - started))
            raise
        self._release(replica, succeeded=True)
        self._event("request", group=replica.number, took_s=round(time.monotonic() - started, 6))
        return [results[r] for r in range(options.world_size)] if all_ranks else results[0]

    def _release(self, replica: Replica, succeeded: bool) -> None:
        """The call on ``replica`` ended without a fault: it serves again."""
        pool = self._set
        with pool.cond:
            ran = pool.dispatch.done(replica)
            if succeeded:
                pool.counts["requests_ok"] += 1
                if ran is not None and ran > self.options.suspect_after:
                    pool.counts["slow_calls"] += 1  # a suspect that was merely slow
            pool.cond.notify_all()

    def call_timeout(self, what: str, value: object) -> float:
        """``value`` as a call's deadline in seconds: finite and at least ``min_call_s``.

        Raises:
            UsageError: naming ``what``.
        """
        limit = seconds(what, value)
        least = self.options.min_call_s
        if limit < least:
            raise UsageError(what, f"{limit:g} s is below the least useful deadline of "
                             f"{least:g} s (a tenth of the pool's timeout)",
                             f"give at least {least:g} s")
        return limit

    def _claim(self, deadline: Deadline, abandon: Abandon | None = None) -> Replica:
        """A replica for the call, marked busy: at once if one is free and no older call waits;
        else the call queues (at most ``max_queue`` calls do) and waits, bounded, but only until
        ``min_call_s`` before ``deadline``: a call that could start only later fails as
        unavailable, and no replica is touched."""
        options, pool = self.options, self._set
        dispatch, counts = pool.dispatch, pool.counts
        latest = deadline.before(options.min_call_s)
        with pool.cond:
            if pool.closed:
                counts["requests_closed"] += 1
                raise PoolClosed("the pool was closed")
            if dispatch.waiting() >= options.max_queue + dispatch.free():
                counts["requests_unavailable"] += 1
                raise PoolUnavailable(UnavailableState.BUSY, 1.0, f"{dispatch.waiting()} calls "
                                      f"wait for a replica already "
                                      f"(max_queue={options.max_queue})")
            ticket = dispatch.enqueue()
            if abandon is not None:
                abandon.wake_on_set(pool.wake)
            first = True  # a free replica is taken at once (the deadline was checked on entry)
            try:
                while True:
                    if pool.closed:
                        counts["requests_closed"] += 1
                        raise PoolClosed("the pool was closed")
                    if abandon is not None and abandon.is_set():
                        counts["requests_abandoned"] += 1
                        raise PoolUnavailable(UnavailableState.ABANDONED, 0.0, "the caller gave "
                                              "the call up while it waited for a replica")
                    now = time.monotonic()
                    for suspect in dispatch.newly_suspect(now):
                        counts["suspicions"] += 1
                        self._event("group_suspect", group=suspect.number,
                                    running_s=round(now - dispatch.busy[suspect], 3))
                    if (first or not latest.passed()) and dispatch.can_take(ticket, now):
                        replica = dispatch.take(ticket)
                        ticket = None
                        return replica
                    state = pool.state()
                    if state == PoolState.FAILED or (state == PoolState.HEALING and
                                                     options.on_healing == HealingMode.FAIL):
                        counts["requests_unavailable"] += 1
                        raise self._unavailable(UnavailableState(state))
                    if latest.passed():
                        counts["requests_unavailable"] += 1
                        raise self._unavailable(UnavailableState.BUSY if dispatch.healthy()
                                                else UnavailableState(state))
                    wake = dispatch.next_suspicion(now)
                    pool.cond.wait(latest.wait_time() if wake is None else
                                   min(wake, latest.wait_time()))
                    first = False
            finally:
                if abandon is not None:
                    abandon.wake_on_set(None)
                if ticket is not None:
                    dispatch.leave(ticket)
                    pool.cond.notify_all()  # a younger call may be first now

    def _unavailable(self, state: UnavailableState) -> PoolUnavailable:
        """Under the lock: the error of a call that no replica can run (``state``: healing,
        starting, failed or busy)."""
        backoff = self._set.backoff
        if state == UnavailableState.FAILED:
            return PoolUnavailable(state, backoff.next_start.wait_time(at_least=1.0),
                                   backoff.describe())
        if state == UnavailableState.BUSY:
            return PoolUnavailable(state, 1.0, "the replicas ran other calls until less than "
                                   f"{self.options.min_call_s:g} s of this call's deadline was "
                                   "left")
        return PoolUnavailable(state, backoff.estimate_s,
                               "faults retired every replica; a new one is starting"
                               if state == UnavailableState.HEALING else
                               "the first replica is starting")

    def _on_fault(self, replica: Replica, fault: RequestFailed) -> None:
        """Count ``fault`` and have the supervisor retire ``replica``
        (``ReplicaKeeper.retire``)."""
        with self._set.cond:
            self._set.counts["requests_failed"] += 1
            self._set.counts[f"faults_{fault.cause}"] += 1
        self._event("request_fault", group=replica.number, rank=fault.rank, cause=fault.cause,
                    detail=fault.detail, victims=fault.victims, took_s=round(fault.took, 4))
        self._keeper.retire(replica, fault)

    # -- state ------------------------------------------------------------------------------------

    def status(self) -> PoolStatus:
        pool = self._set
        with pool.cond:
            failure = pool.backoff.last_failure
            state = pool.state()
            now = time.monotonic()
            serving = state == PoolState.READY
            return PoolStatus(state, pool.dispatch.spare_replicas(now) if serving else 0,
                              pool.coming(), failure.describe() if failure else None,
                              idle=pool.dispatch.free(now) if serving else 0,
                              serving=len(pool.dispatch.busy),
                              suspect=len(pool.dispatch.suspects(now)),
                              waiting=pool.dispatch.waiting(), replicas=self.options.replicas,
                              placement=pool.placement(), healing=len(pool.retired),
                              warm_spares={device: count.ready for device, count
                                           in self._keeper.warm.counts().items()})

    def wait_ready(self, timeout: float) -> None:
        """Wait until a replica serves calls.

        Raises:
            PoolUnavailable: start-up failed (``failed``) or ``timeout`` passed.
            PoolClosed: the pool was closed.
        """
        until = Deadline.after(timeout)
        pool = self._set
        with pool.cond:
            while not pool.dispatch.healthy():
                if pool.closed:
                    raise PoolClosed("the pool was closed")
                state = pool.state()
                if state == PoolState.FAILED:
                    raise self._unavailable(UnavailableState.FAILED)
                if until.passed():
                    raise PoolUnavailable(state, pool.backoff.estimate_s,
                                          f"no replica was ready within {timeout:g} s")
                pool.cond.wait(until.wait_time())

    def heal_durations(self) -> list[float]:
        """Seconds each heal took, from losing the serving replica to a new one serving: the
        latest ``heal_times.RECENT`` (1000), oldest first."""
        with self._set.cond:
            return list(self._set.heal_times.recent)

    def heal_buckets(self) -> list[tuple[str, int]]:
        """Every heal since the pool started, in the cumulative buckets of the
        ``rankguard_pool_heal_seconds`` histogram (``heal_times.HEAL_BUCKETS``, then
        ``+Inf``)."""
        with self._set.cond:
            return self._set.heal_times.buckets()

    def metrics(self) -> dict[str, float]:
        """Counters and gauges: requests by outcome, faults by cause, heals and their time,
        start-up failures, spares."""
        pool = self._set
        with pool.cond:
            values: dict[str, float] = dict(pool.counts)
            if self._keeper.zygote.failures:
                values["zygote_failures"] = self._keeper.zygote.failures
            values["spares_ready"] = pool.dispatch.spare_replicas()
            values["spares_starting"] = pool.coming()
            values["serving"] = len(pool.dispatch.busy)
            values["heal_seconds_sum"] = pool.heal_times.total_s
            values["heal_seconds_count"] = pool.heal_times.count
            return values

    def _event(self, name: str, **fields: Any) -> None:
        if self._journal is not None:
            self._journal.write(name, **fields)

    # -- the end ----------------------------------------------------------------------------------

    def close(self, timeout: float = 5.0, *, cut_calls: bool = False) -> None:
        """Stop the supervisor and shut every replica down: the serving replica and the
        spares get a bounded barrier and exit; whatever is left after ``timeout`` is killed. A
        call still running then raises :class:`PoolClosed`. The log folder goes too when the
        pool made it (no ``log_dir`` was given). Returns within ``timeout`` plus about
        ``CLOSE_JOIN_S``. Idempotent: a second call waits for the first one's shutdown (bounded
        by its own ``timeout``).

        ``cut_calls``: the callers of the calls still running have their answers already
        (``rankguard serve`` at the end of its ``--grace``): the replicas running them are
        killed at once, not given ``timeout`` to finish them (their ranks cannot join the
        barrier before), and those calls raise :class:`PoolClosed` then.

        Raises:
            UsageError: ``timeout`` is not a number of seconds from 0 to ``MAX_SECONDS`` (the
                pool is left as it was: close it again with a good one).
        """
        timeout = check_seconds("Pool.close(timeout)", timeout, zero=True, text=False)
        joined_by = Deadline.after(timeout + CLOSE_JOIN_S)
        pool = self._set
        with pool.cond:
            first = not pool.closed
            if first:
                pool.closed = True
                pool.closed_until = Deadline.after(timeout)
                pool.closed_join_by = joined_by
                pool.closed_cut = cut_calls
                pool.cond.notify_all()
        self._keeper.join(joined_by)
        if not first:
            return
        self._event("pool_close", groups=pool.closed_replicas)
        # events of background threads that end later go nowhere, not to a closed file
        journal, self._journal = self._journal, None
        if journal is not None:
            journal.close()
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        self._guardian.close()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _open_journal(path: str, pool_id: str) -> Journal:
    path = writable_file("Pool(journal)", path)
    private_files.check_own_file(path, "Pool(journal)")
    try:
        return Journal(path, pool_id)
    except OSError as error:
        raise UsageError("Pool(journal)", f"cannot open {path!r}: {error.strerror}",
                         "choose a file you can write to") from None
