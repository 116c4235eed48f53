"""Every replica of a pool, by stage, and what the pool counts, under the pool's one lock.

A replica is being created (its ranks being started, outside the lock: only counted here),
starting (its setup running), healthy (in ``dispatch``: ready, or running a call), or retired
after a fault and regrouping in place. The condition wakes whoever waits on the set: a call
for a replica, the supervisor for a change, ``Pool.wait_ready``; :meth:`ReplicaSet.wake` is how
another object (a replica's watcher, an abandoned call) wakes them.

Every field and method is used under ``cond`` except :meth:`wake`, which takes it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

from ..deadline import Deadline
from .backoff import StartBackoff
from .dispatch import Dispatch
from .heal_times import HealTimes
from .pool_state import PoolState, state_of
from .replica import Replica

Event = Callable[..., None]  # the pool's journal: event(name, **fields)


class ReplicaSet:
    """A pool's replicas and counts; see the module docstring.

    Args:
        replicas: how many replicas serve at once.
        suspect_after: seconds after which a running call's replica is a suspect.
        max_backoff: the longest pause between start-ups that keep failing.
        event: writes a journal event.
    """

    def __init__(self, replicas: int, suspect_after: float, max_backoff: float,
                 event: Event) -> None:
        self.cond = threading.Condition()
        self.replicas = replicas
        self.dispatch: Dispatch[Replica] = Dispatch(replicas, suspect_after)
        self.starting: list[Replica] = []
        self.retired: list[Replica] = []  # regrouping in the background
        self.creating: list[int] = []  # the slots of the replicas the supervisor is creating,
        # outside the lock
        self.numbers = 0  # the last replica's number
        self.backoff = StartBackoff(max_backoff)
        self.closed = False
        self.closed_until = Deadline.never()  # set by close: when what is left is killed,
        self.closed_join_by = Deadline.never()  # and how long the shutdown may take,
        self.closed_cut = False  # and whether the calls still running were answered already
        self.closed_replicas = 0  # replicas the shutdown ended
        self.counts: Counter[str] = Counter()
        self.heal_times = HealTimes()
        self._lost_at: list[float] = []  # when replicas were lost, until the pool is whole
        self._event = event

    def wake(self) -> None:
        """Wake whoever waits on the set (it changed). Takes the lock."""
        with self.cond:
            self.cond.notify_all()

    def state(self) -> PoolState:
        return state_of(self.closed, self.dispatch.healthy(), self.backoff.gave_up(),
                        bool(self._lost_at))

    def coming(self) -> int:
        """Replicas being created or starting."""
        return len(self.starting) + len(self.creating)

    def slots_held(self) -> set[int]:
        """The slots (``serving.placement``) of the replicas the supervisor need not replace
        (:meth:`kept`): a new replica takes another."""
        held = [*self.dispatch.ready, *self.dispatch.busy, *self.starting, *self.retired]
        return {replica.slot for replica in held} | set(self.creating)

    def placement(self) -> dict[int, tuple[str, ...]]:
        """Each healthy replica's number -> the device of each of its ranks."""
        return {replica.number: replica.placement.devices
                for replica in sorted([*self.dispatch.ready, *self.dispatch.busy],
                                      key=lambda replica: replica.number)}

    def kept(self) -> int:
        """Replicas healthy, coming or regrouping: those the supervisor need not replace."""
        return self.dispatch.healthy() + self.coming() + len(self.retired)

    def lose(self, replica: Replica) -> None:
        """``replica`` no longer serves; the pool heals from that moment."""
        if self.dispatch.remove(replica):
            self._lost_at.append(time.monotonic())

    def count_heals(self) -> None:
        """Each loss of a replica is healed once ``replicas`` healthy replicas serve again (at
        once when a spare was ready)."""
        while self._lost_at and self.dispatch.healthy() >= self.replicas and not self.closed:
            took = time.monotonic() - self._lost_at.pop(0)
            self.heal_times.add(took)
            self.counts["heals"] += 1
            self._event("heal", healthy=self.dispatch.healthy(), took_s=round(took, 4))
