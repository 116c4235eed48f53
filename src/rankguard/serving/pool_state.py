"""Where a pool stands: its :class:`PoolState`, decided by :func:`state_of` (a pure function of
what the pool knows under its lock), and the :class:`PoolStatus` that ``Pool.status()``
returns."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class PoolState(enum.StrEnum):
    """A pool's state (:attr:`PoolStatus.state`). A ``str``: it compares equal to, prints as
    and goes into JSON as its value."""

    STARTING = "starting"  # the first replica is not ready yet
    READY = "ready"  # a healthy replica serves calls, or is idle
    HEALING = "healing"  # faults retired every replica; the next one is starting
    FAILED = "failed"  # the setup raised, or start-ups keep failing
    CLOSED = "closed"


def state_of(closed: bool, healthy: int, gave_up: bool, lost: bool) -> PoolState:
    """The pool's state.

    Args:
        closed: the pool was closed.
        healthy: replicas ready or running a call.
        gave_up: the start-ups are failing for good (``StartBackoff.gave_up``).
        lost: a replica was lost and the pool is not whole again.
    """
    if closed:
        return PoolState.CLOSED
    if healthy:
        return PoolState.READY
    if gave_up:
        return PoolState.FAILED
    return PoolState.HEALING if lost else PoolState.STARTING


@dataclass(frozen=True)
class PoolStatus:
    """Where a pool stands.

    Attributes:
        state: ``ready`` (a healthy replica serves calls, or is idle), ``starting`` (the first
            replica is not ready yet), ``healing`` (faults retired every replica; the next one
            is starting), ``failed`` (the setup raised, or start-ups failed 3 times in a row;
            see ``last_start_failure``; start-ups go on, with backoff) or ``closed``: a
            :class:`PoolState`.
        spares_ready: ready replicas beyond those that can take a call now.
        spares_starting: replicas starting (their ranks being started, or their setup
            running).
        last_start_failure: why the last start-up failed, or None.
        idle: replicas that can take a call now (ready, running none, within ``replicas``).
        serving: replicas running a call, suspects included.
        suspect: replicas whose call has run past ``suspect_after`` (drained).
        waiting: calls waiting for a replica.
        replicas: how many replicas serve at once (the pool's ``replicas``).
        placement: each healthy replica (ready or running a call), by its number (the
            journal's ``group``) -> the device of each of its ranks (``cpu``, ``cuda:0``).
        healing: replicas retired after a fault that are being healed in place (regrouping,
            or their unusable ranks being replaced); they serve again once healed.
        warm_spares: the warm spare ranks ready, by device (``Pool(warm_spares=)``).
    """

    state: PoolState
    spares_ready: int
    spares_starting: int
    last_start_failure: str | None
    idle: int = 0
    serving: int = 0
    suspect: int = 0
    waiting: int = 0
    replicas: int = 1
    placement: dict[int, tuple[str, ...]] = field(default_factory=dict)
    healing: int = 0
    warm_spares: dict[str, int] = field(default_factory=dict)
