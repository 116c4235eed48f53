"""The pool's supervisor thread: it keeps ``replicas + spares`` replicas started (forked from
the pool's zygote, or cold), with backoff when start-ups keep failing, retires the replicas
that faults or dead ranks made unfit (regrouped in place, or killed after their stacks), and
shuts every replica down when the pool closes.

It sleeps until something happens (a replica became ready, failed, lost a rank; a call retired
one; a backoff ended): no polling tick. It starts replicas outside the pool's lock: starting
ranks takes a while (the first store imports torch, a fork waits for the zygote), and calls,
probes and metrics must not wait for it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, NamedTuple

from ..processes import stack_summary
from ..deadline import Deadline
from ..errors import RequestFailed
from .budgets import REGROUP_MARGIN_S, REGROUP_S, STACKS_S
from .heal_plan import Heal, HealPlan, heal, idle_heal, stopped_heal
from .pool_options import PoolOptions
from .placement import CPU, DEVICE_ENV, free_slot
from .pool_zygote import FORK_S, PoolZygote
from .replica import Replica, StartFailure, StartState, cold_start
from .replica_set import Event, ReplicaSet
from .warm_spares import WarmSpares


SPAWN_S = FORK_S + 3.0  # a replacement's start: a fork from the zygote, or a cold Popen


class _Start(NamedTuple):
    """A replica the supervisor is to start: its number, whether from the zygote, and the
    slot it takes (where its ranks run)."""

    number: int
    fork: bool
    slot: int


class ReplicaKeeper:
    """A pool's supervisor thread; see the module docstring.

    Args:
        options: the pool's options.
        log_dir: the pool's log folder (each replica's goes in it).
        replicas: the pool's replica set, and its lock.
        event: writes a journal event.
        marker: environment that marks every process the pool starts, and what those start
            (the pool's guardian kills them after a SIGKILL of this process).
    """

    def __init__(self, options: PoolOptions, log_dir: str, replicas: ReplicaSet,
                 event: Event, marker: Mapping[str, str]) -> None:
        self._options = options
        self._log_dir = log_dir
        self._set = replicas
        self._event = event
        self._env = {**options.env, **marker}  # the base of every rank's environment
        self.zygote = PoolZygote(options.zygote, self._env, log_dir, options.start_timeout,
                                 replicas.wake, event)
        self.warm = WarmSpares(self._env, log_dir, options.start_timeout, self._warm_changed)
        self._warm_due = bool(options.warm_devices)  # warm spares may be missing: look
        self._thread = threading.Thread(target=self._supervise, name="rankguard-pool",
                                        daemon=True)
        # a rank dies with the thread that started it (PR_SET_PDEATHSIG), so a replacement is
        # started by this thread, which lives until the pool's ranks are gone, not by the
        # short-lived thread that heals its replica
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="rankguard-spawn")

    def start(self) -> None:
        self._thread.start()

    def join(self, until: Deadline) -> None:
        """Wait, until ``until`` at most, for the thread to end (once the pool is closed)."""
        self._thread.join(until.wait_time_or_none())

    # -- the loop -------------------------------------------------------------------------------

    def _supervise(self) -> None:
        """Until the pool closes: take in what changed, start what is missing, and sleep until
        the next change (``ReplicaSet.wake``, or any ``notify_all``) or the end of a backoff.
        Then shut the replicas down, here: the ranks die with the thread that started them
        (PR_SET_PDEATHSIG follows the thread, not the process), so this thread must outlive
        them, or a close would SIGKILL them at once, mid-call and without their shutdown."""
        pool = self._set
        while True:
            with pool.cond:
                if pool.closed:
                    break
                self._check_starting()
                self._check_idle()
                plan = self._plan()
                warm = not isinstance(plan, _Start) and self._warm_due and \
                    pool.dispatch.healthy() >= self._options.replicas and not pool.coming()
                if not isinstance(plan, _Start) and not warm:
                    pool.cond.wait(plan)
                    continue
                if warm:
                    self._warm_due = False
                else:
                    pool.creating.append(plan.slot)
            if warm:
                self._fill_warm()
                continue
            replica = self._create(plan)
            with pool.cond:
                pool.creating.remove(plan.slot)
                if replica is not None:
                    pool.starting.append(replica)
                    self._event("group_start", group=replica.number, pids=replica.pids,
                                slot=replica.slot, devices=replica.placement.devices)
                pool.cond.notify_all()
        self._shut_down()

    def _warm_changed(self) -> None:
        """A warm spare became ready, failed or was taken: the supervisor looks again."""
        self._warm_due = True
        self._set.wake()

    def _fill_warm(self) -> None:
        """Not under the lock, from this thread (the warm spares die with the thread that
        started them): start the missing warm spares, once every replica serves (they never
        slow a start or a heal). One that cannot even be started (no descriptor) is tried
        again at the next change."""
        for device in self._options.warm_devices:
            try:
                self.warm.fill(device, self._options.warm_spares)
            except OSError as error:
                self._event("warm_spare_failed", device=device,
                            detail=f"could not be started: {error}")

    def _check_starting(self) -> None:
        """Under the lock: the replicas that became ready serve; those that failed are
        killed."""
        pool = self._set
        for replica in list(pool.starting):
            state = replica.start_state()
            if state == StartState.STARTING:
                continue
            pool.starting.remove(replica)
            if state == StartState.READY:
                took = (replica.ready_at or time.monotonic()) - replica.started_at
                pool.backoff.succeeded(took)
                pool.dispatch.add(replica)
                self._event("group_ready", group=replica.number, role="started",
                            took_s=round(took, 3))
                pool.count_heals()
            else:
                replica.kill()
                self._start_failed(replica.number, replica.failure or StartFailure(None, "failed"))
            pool.cond.notify_all()

    def _start_failed(self, number: int, failure: StartFailure) -> None:
        """Under the lock: replica ``number`` did not start; the next try waits a backoff."""
        pool = self._set
        pause = pool.backoff.failed(failure)
        pool.counts["start_failures"] += 1
        self._event("group_start_failed", group=number, rank=failure.rank,
                    detail=failure.detail, traceback=failure.remote_traceback,
                    consecutive=pool.backoff.failures, backoff_s=pause)

    def _check_idle(self) -> None:
        """Under the lock: a ready replica that lost ranks has them replaced (killed when it
        lost them all)."""
        pool = self._set
        for replica in list(pool.dispatch.ready):
            if not replica.alive():
                self._carry_out(replica, idle_heal(replica.world, replica.dead_ranks()),
                                "a rank of an idle replica died")
        pool.count_heals()

    def _plan(self) -> _Start | float | None:
        """Under the lock: the replica to start next, if one is missing and no backoff holds it
        back; else how long the supervisor may sleep before it must look again (None: until
        something changes)."""
        pool = self._set
        slot = free_slot(pool.slots_held(), len(self._options.placement))
        if slot is None or pool.kept() >= self._options.replicas + self._options.spares:
            return None
        if pool.coming() and pool.backoff.failures:
            return None  # failing: one attempt at a time
        if not pool.backoff.next_start.passed():
            return pool.backoff.next_start.wait_time()
        waiting = self.zygote.wait_time()
        if waiting is not None:
            return waiting
        pool.numbers += 1
        return _Start(pool.numbers, self.zygote.ready, slot)

    def _create(self, start: _Start) -> Replica | None:
        """Not under the lock: the replica ``start`` describes, starting; None if its ranks
        could not even be started (no file descriptor, no memory...): a failed start-up."""
        options = self._options
        try:
            replica = Replica(start.number, options.world_size, options.setup,
                              os.path.join(self._log_dir, f"group{start.number}"),
                              dict(self._env), Deadline.after(options.start_timeout),
                              self._set.wake, self.zygote.starter(start.fork),
                              options.placement[start.slot], start.slot)
        except Exception as error:  # noqa: BLE001 (no descriptor, no memory, the store's
            # "Failed to init uv loop"...: whatever it is, a start-up that failed, retried with
            # backoff; the supervisor must not die of it)
            with self._set.cond:
                self._start_failed(start.number, StartFailure(
                    None, f"could not be started: {getattr(error, 'strerror', None) or error}"))
            return None
        with self._set.cond:
            if self._set.closed:
                replica.kill()
                return None
        return replica

    # -- after a fault --------------------------------------------------------------------------

    def retire(self, replica: Replica, fault: RequestFailed) -> None:
        """Retire ``replica`` after ``fault``, as ``heal_plan.heal`` decides: regrouped in
        place (after the call, when it merely overran its deadline), its unusable ranks
        replaced (after their stacks, for a hang), or killed (after its stacks, for a
        hang)."""
        with self._set.cond:
            self._carry_out(replica, heal(fault, replica.world, replica.dead_ranks()),
                            fault.cause)

    def _carry_out(self, replica: Replica, plan: HealPlan, reason: str) -> None:
        """Under the lock: ``replica`` no longer serves; heal it as ``plan`` says (in the
        background, or at once for a kill)."""
        background = {Heal.REGROUP: self._regroup, Heal.DRAIN_THEN_REGROUP: self._drain_then_regroup,
                      Heal.REPLACE: self._replace, Heal.STACKS_THEN_REPLACE: self._replace}
        pool = self._set
        pool.lose(replica)
        self._retired(replica, plan, reason)
        if plan.action in background:
            pool.retired.append(replica)
            threading.Thread(target=self._heal, args=(background[plan.action], replica, plan),
                             daemon=True, name=f"rankguard-{plan.action}").start()
        elif plan.action is Heal.STACKS_THEN_KILL:
            threading.Thread(target=self._stacks_then_kill, args=(replica,), daemon=True,
                             name="rankguard-stacks").start()
        else:
            replica.kill()
        pool.count_heals()
        pool.cond.notify_all()

    def _retired(self, replica: Replica, plan: HealPlan, reason: str) -> None:
        """Under the lock: journal and count what ``plan`` does with ``replica`` and why."""
        self._event("group_retire", group=replica.number, action=plan.action, reason=reason,
                    ranks=sorted(plan.replace),
                    kept=sorted(set(range(replica.world)) - plan.replace))
        self._set.counts[f"heal_{plan.action}"] += 1

    def _killed(self, replica: Replica, reason: str) -> None:
        """Under the lock: journal and count that ``replica``'s heal ended in its kill."""
        self._retired(replica, HealPlan(Heal.KILL, frozenset(range(replica.world))), reason)

    def _heal(self, how: Callable[[Replica, HealPlan], None], replica: Replica,
              plan: HealPlan) -> None:
        """``how(replica, plan)`` on a thread of its own; whatever it raises (it should not),
        the replica is killed rather than left retired for good (the pool would never replace
        it)."""
        try:
            how(replica, plan)
        except BaseException as error:  # noqa: BLE001 (the pool must go on whatever it is)
            with self._set.cond:
                if replica in self._set.retired:
                    self._set.retired.remove(replica)
                self._killed(replica, f"its healing failed: {type(error).__name__}: {error}")
                self._set.cond.notify_all()
            replica.kill()

    def _stacks(self, replica: Replica, ranks: list[int] | None = None) -> None:
        """Where each of ``ranks`` (default: all) was stuck, to the journal. The ranks get as
        long to answer as a call gets to run (at least ``STACKS_S``); the wait ends as soon as
        every rank has answered."""
        dumps = replica.capture_stacks(Deadline.after(max(STACKS_S, self._options.timeout)),
                                       ranks)
        self._event("stacks", group=replica.number,
                    stacks={rank: replica.stacks_path(rank) for rank in dumps},
                    grouped=stack_summary.describe(
                        stack_summary.by_stack(dumps, sorted(dumps)), ""))

    def _stacks_then_kill(self, replica: Replica) -> None:
        """After a hang verdict that singled out no culprit, or a heal that failed: every live
        rank's stacks (``_stacks``), then the replica is killed (the call already failed, and
        the replica no longer counts as one: this delays neither)."""
        try:
            self._stacks(replica)
        finally:
            replica.kill()

    def _drain_then_regroup(self, replica: Replica, plan: HealPlan) -> None:
        """A replica whose call overran the call's own deadline, every rank still running it:
        once every rank has finished that call (within the pool's timeout) it regroups and
        serves again; the ranks that do not finish by then get the hang treatment (stacks,
        then replaced; the replica is killed when none finished)."""
        late = replica.drain(Deadline.after(self._options.timeout)) if not self._set.closed \
            else frozenset(range(replica.world))
        if not late:
            self._regroup(replica, plan)
        elif len(late) < replica.world:
            plan = HealPlan(Heal.STACKS_THEN_REPLACE, late)
            with self._set.cond:
                self._retired(replica, plan, "its ranks did not finish the overrun call")
            self._replace(replica, plan)
        else:
            with self._set.cond:
                self._set.retired.remove(replica)
                self._set.cond.notify_all()
            self._stacks_then_kill(replica)

    def _regroup(self, replica: Replica, plan: HealPlan) -> None:
        """A replica whose ranks only raised forms a fresh generation and becomes a spare
        again."""
        started = time.monotonic()
        ok = replica.regroup(Deadline.after(REGROUP_S + REGROUP_MARGIN_S))
        self._back(replica, {"role": "regrouped", "took_s": round(time.monotonic() - started, 3)}
                   if ok else None, "its ranks did not form a new generation")

    def _replace(self, replica: Replica, plan: HealPlan) -> None:
        """A replica with unusable ranks (``plan.replace``): their stacks first, for a hang;
        then new processes take their places in a new generation beside the survivors, which
        keep theirs; the replica serves again once each new rank ran the setup, within the
        pool's ``start_timeout``. Killed when that fails."""
        started = time.monotonic()
        places = sorted(plan.replace)
        if plan.action is Heal.STACKS_THEN_REPLACE:
            self._stacks(replica, places)
        until = Deadline.after(self._options.start_timeout)
        self._event("ranks_replace", group=replica.number, ranks=places)
        starter = self.zygote.starter(self.zygote.ready) or cold_start
        warm: list[int] = []  # the places a warm spare took

        def start_rank(env: dict[str, str], log: str, channel_fd: int) -> Any:
            spare = self.warm.take(env.get(DEVICE_ENV) or CPU)
            proc = self._spawner.submit(spare or starter, env, log, channel_fd).result(SPAWN_S)
            if spare is not None:
                self._warm_changed()
                if not spare.fallback:
                    warm.append(int(env["RANK"]))
            return proc

        done = replica.replace_ranks(places, until, Deadline.after(self._options.timeout),
                                     start_rank)
        self._back(replica, {"role": "ranks_replaced", "ranks": list(done.ranks),
                             "pids": replica.pids,
                             "warm": warm, "took_s": round(time.monotonic() - started, 3),
                             "parts": done.parts} if done.ok else None,
                   f"replacing ranks {', '.join(map(str, places))} failed: {done.why}")

    def _back(self, replica: Replica, ready: dict[str, Any] | None, failed: str) -> None:
        """A retired replica's heal ended: it serves again (``ready``: its ``group_ready``
        event's fields), unless one of its ranks is stopped (that rank's heal follows); or
        it is killed (``failed``: why, for ``group_retire``; nothing is said when the pool
        closed meanwhile: the close killed it), after the stacks of its live ranks went to the
        journal (where the heal left them: a survivor that never regrouped, say)."""
        stopped = replica.stopped_ranks() if ready is not None else frozenset()
        pool = self._set
        gave_up = False
        with pool.cond:
            pool.retired.remove(replica)
            if pool.closed:
                replica.kill()
            elif ready is None:
                self._killed(replica, failed)
                gave_up = True
            elif stopped:
                self._carry_out(replica, stopped_heal(replica.world, stopped),
                                "a rank was stopped while its replica healed")
            else:
                pool.counts["ranks_replaced"] += len(ready.get("ranks", ()))
                pool.dispatch.add(replica)
                self._event("group_ready", group=replica.number, **ready)
                pool.count_heals()
            pool.cond.notify_all()
        if gave_up:
            self._stacks_then_kill(replica)

    # -- the end --------------------------------------------------------------------------------

    def _shut_down(self) -> None:
        """The supervisor's last act, once the pool is closed: kill the replicas that were
        starting or regrouping, and close the others (a bounded barrier, then a kill at the
        close's deadline; at once for those running a call the close cut), all at once."""
        pool = self._set
        with pool.cond:
            until, joined_by, cut = pool.closed_until, pool.closed_join_by, pool.closed_cut
            replicas = pool.dispatch.clear()
            doomed = pool.starting + pool.retired
            pool.starting = []
            pool.closed_replicas = len(replicas) + len(doomed)
        for replica in doomed:
            replica.kill()
        closers = [threading.Thread(target=r.close, args=(until, cut), daemon=True)
                   for r in replicas]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(joined_by.wait_time_or_none())
        self.warm.close(until)
        self.zygote.close(until)
        self._spawner.shutdown(wait=False)
