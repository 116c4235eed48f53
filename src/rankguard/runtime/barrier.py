"""The store barrier: ranks meet in the job's store, each bounded by a deadline, and the ones
that did not come are named.

Used by ``rankguard.shutdown()``, by ``regroup()`` (the members join a new generation) and by
the pytest plugin's re-forming of a suite's group (each rank brings where it is in the suite).
One call of :func:`meet` on every rank, under a name unique to that meeting:

1. **arrive**: the rank writes its arrival under ``NAME/RANK`` (with an optional payload), then
   adds 1 to the counter ``NAME/count``;
2. **release**: a rank whose addition brings the counter to the group's size checks that every
   arrival is there and authentic, and then sets ``NAME/released``;
3. **wait**: the others block in the store's own ``wait`` on ``NAME/released`` until the
   deadline: they wake when it is set, without polling;
4. **name the missing**: at the deadline, the arrivals present (``check``) and authentic
   (``multi_get``) say who came; the others are missing. A caller that may learn, outside the
   store, that a rank will never come (``regroup`` waiting for a replacement the launcher
   refused to start) gives ``stop``: the key is then polled every ``STOP_POLL_S`` and the wait ends
   at the first look after which ``stop()`` is true, as at the deadline.

Every value a rank acts on is sealed with the run's secret (``rankguard.sealed``). The counter is
only a hint of who may be last: a rank releases only once it read every rank's authentic arrival,
and a waiter that finds a release it cannot open deletes it and waits again (the genuine one
wakes it), after checking the arrivals itself. So another process that writes into the store can
delay the ranks at most until their deadline; it cannot make them go on.

Bounds: the wait ends at the deadline; each store operation has the time left, at least
``STORE_OP_MIN_S`` (a store that died fails at once; one that froze, after that). A FileStore
notices a deadline up to a second late (its own ``wait`` polls).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

from ..store import sealed
from ..deadline import MAX_SECONDS, Deadline

STORE_OP_MIN_S = 1.0  # the least time a store operation gets, even once the deadline passed
# torch's store takes a wait of 0 ms as "no timeout": never hand it less than a millisecond
_WAIT_MIN_S = 0.001
# a wait that ends sooner than this before its deadline did not time out: the store failed
_EARLY_S = 0.05
_ARRIVED = "arrived"
STOP_POLL_S = 0.02  # how often a meeting given ``stop`` looks for its key and at ``stop``


@dataclass(frozen=True)
class Meeting:
    """Who came to a barrier.

    Attributes:
        size: how many ranks were expected (ranks ``0 .. size-1``).
        arrived: rank -> the payload it brought, for every authentic arrival found.
    """

    size: int
    arrived: dict[int, str]

    @property
    def missing(self) -> list[int]:
        """The ranks whose authentic arrival was not found by the deadline."""
        return [r for r in range(self.size) if r not in self.arrived]

    @property
    def complete(self) -> bool:
        """Every rank arrived."""
        return len(self.arrived) == self.size


def arrival_key(name: str, rank: int) -> str:
    """The key under which ``rank`` marks its arrival at the barrier ``name``."""
    return f"{name}/{rank}"


def released_key(name: str) -> str:
    """The key that says every rank arrived at the barrier ``name``."""
    return f"{name}/released"


def meet(client: Any, name: str, rank: int, size: int, limit: Deadline,
         payload: str = _ARRIVED, stop: Callable[[], bool] | None = None) -> Meeting:
    """Arrive at the barrier ``name`` as ``rank`` of ``size`` and wait until every rank did, or
    until ``limit``, or (given ``stop``) until ``stop()`` is true (checked once arrived, then
    every ``STOP_POLL_S``).

    Args:
        client: a store client of this rank's own (its timeout is set here).
        name: unique to this meeting (every rank passes the same one).
        rank: this rank, ``0 <= rank < size``.
        size: how many ranks meet.
        limit: when to stop waiting.
        payload: what this rank brings (every rank reads every payload).
        stop: says that the ranks still missing will never come.

    Returns:
        Who came, with what. Incomplete only if ``limit`` passed, or ``stop()`` was true,
        first.

    Raises:
        RuntimeError: torch's, when the store fails (its server died, froze, or refused).
    """
    client.set_timeout(_time_left(limit, STORE_OP_MIN_S))
    keys = [arrival_key(name, r) for r in range(size)]
    released = released_key(name)
    arrived = _arrive(client, name, keys, rank, payload)
    if arrived is not None:
        return Meeting(size, arrived)
    while _wait(client, released, limit, stop):
        if sealed.unseal(released, client.get(released)) is not None:
            break  # the releaser read every arrival
        client.delete_key(released)  # not ours: the genuine release will wake us
        arrived = _authentic(client, keys)  # it may have come just before the delete
        if len(arrived) == size:
            # and the delete may have removed it, after the forged value was read: release
            # again, or the ranks still waiting would wait until ``limit``
            _release(client, released)
            return Meeting(size, arrived)
    return Meeting(size, _authentic(client, keys))


def arrive(client: Any, name: str, rank: int, size: int, limit: Deadline,
           payload: str = _ARRIVED) -> None:
    """Arrive at the barrier ``name`` as ``rank`` of ``size`` without waiting for the others
    (steps 1 and 2 of :func:`meet`): the ranks that meet there see this rank come with
    ``payload``. Each store operation has the time left before ``limit``, at least
    ``STORE_OP_MIN_S``.

    Raises:
        RuntimeError: torch's, when the store fails.
    """
    client.set_timeout(_time_left(limit, STORE_OP_MIN_S))
    _arrive(client, name, [arrival_key(name, r) for r in range(size)], rank, payload)


def _arrive(client: Any, name: str, keys: list[str], rank: int, payload: str
            ) -> dict[int, str] | None:
    """Write this rank's arrival; release the barrier if it completes it. Returns every
    rank's payload when it did, else None."""
    client.set(keys[rank], sealed.seal(keys[rank], payload))
    if client.add(f"{name}/count", 1) >= len(keys):
        arrived = _authentic(client, keys)
        if len(arrived) == len(keys):
            _release(client, released_key(name))
            return arrived
    return None


def arrivals(client: Any, name: str, size: int) -> dict[int, str]:
    """rank -> payload of every authentic arrival at the barrier ``name`` of ``size`` ranks,
    now (a read, no wait)."""
    return _authentic(client, [arrival_key(name, r) for r in range(size)])


def _release(client: Any, released: str) -> None:
    client.set(released, sealed.seal(released, "released"))


def _wait(client: Any, key: str, limit: Deadline, stop: Callable[[], bool] | None = None
          ) -> bool:
    """Whether ``key`` is set before ``limit`` (False once it passed, or once ``stop()`` is
    true, checked every ``STOP_POLL_S``).

    With ``stop``, the key is polled (``check``), not waited for in slices: each store wait
    that times out makes torch print two warnings ("waitForInput ... likely a timeout"), and
    slices of 0.1 s printed some 260 lines on the terminal in one recovery of three ranks."""
    if stop is None:
        while not limit.passed():  # a store rounds its timeout down to whole milliseconds
            try:
                client.wait([key], _time_left(limit, _WAIT_MIN_S))
                return True
            except RuntimeError:
                if limit.remaining() > _EARLY_S:  # not a timeout: the store failed
                    raise
        return False
    while not limit.passed() and not stop():
        if client.check([key]):
            return True
        time.sleep(limit.wait_time(STOP_POLL_S))
    return False


def _authentic(client: Any, keys: list[str]) -> dict[int, str]:
    """rank -> payload of each arrival (``keys[rank]``) present and sealed for its key."""
    ranks = (list(range(len(keys))) if client.check(keys)
             else [r for r, key in enumerate(keys) if client.check([key])])
    values = client.multi_get([keys[r] for r in ranks]) if ranks else []
    arrived = {}
    for r, value in zip(ranks, values):
        payload = sealed.unseal(keys[r], value)
        if payload is not None:
            arrived[r] = payload
    return arrived


def _time_left(limit: Deadline, at_least: float) -> timedelta:
    return timedelta(seconds=limit.wait_time(MAX_SECONDS, at_least=at_least))
