"""Which replica of a pool takes the next call: ``replicas`` calls run at once, in order of
arrival, and a call never waits behind one that has run past the suspicion time.

A replica runs one call at a time. ``replicas`` of them serve at once; the others (the spares)
are ready but take no call, unless a serving replica has been running its call for longer than
``suspect_after`` seconds: it is then a **suspect**, drained (it takes no new call while its own
runs) and it no longer counts against ``replicas``, so that a ready spare takes the next call in
its place. A suspect whose call ends well is an ordinary ready replica again; one whose call
fails is retired by the pool like any other.

Waiting calls are served first come, first served: each holds a ticket, and only the oldest
tickets may take the replicas that are free.

Not thread-safe: the pool's lock guards every use. Never blocks.
"""

from __future__ import annotations

import time
from typing import Generic, TypeVar

Member = TypeVar("Member")


class Dispatch(Generic[Member]):
    """The ready and busy replicas of a pool, and the calls waiting for one.

    Args:
        replicas: how many calls run at once (suspects aside).
        suspect_after: seconds after which a running call's replica is a suspect.
    """

    def __init__(self, replicas: int, suspect_after: float) -> None:
        self.replicas = replicas
        self.suspect_after = suspect_after
        self.ready: list[Member] = []  # healthy and idle, longest idle first
        self.busy: dict[Member, float] = {}  # replica -> when its call started (monotonic)
        self.reported: set[Member] = set()  # suspects already told about (see newly_suspect)
        self._tickets: list[object] = []  # the calls waiting, oldest first

    # -- what is there ----------------------------------------------------------------------

    def healthy(self) -> int:
        """Replicas ready or running a call."""
        return len(self.ready) + len(self.busy)

    def suspects(self, now: float | None = None) -> list[Member]:
        """Busy replicas whose call has run for longer than ``suspect_after``."""
        now = time.monotonic() if now is None else now
        return [r for r, since in self.busy.items() if now - since > self.suspect_after]

    def free(self, now: float | None = None) -> int:
        """How many calls could start now: ready replicas, up to the serving slots that no
        trusted call (a busy replica that is not a suspect) holds."""
        trusted = len(self.busy) - len(self.suspects(now))
        return max(0, min(len(self.ready), self.replicas - trusted))

    def spare_replicas(self, now: float | None = None) -> int:
        """Ready replicas beyond those that could take a call now."""
        return len(self.ready) - self.free(now)

    def next_suspicion(self, now: float | None = None) -> float | None:
        """Seconds until the next busy replica becomes a suspect (None: none will)."""
        now = time.monotonic() if now is None else now
        times = [since + self.suspect_after - now for since in self.busy.values()
                 if now - since <= self.suspect_after]
        return max(0.0, min(times)) + 1e-3 if times else None

    # -- calls --------------------------------------------------------------------------------

    def enqueue(self) -> object:
        """A ticket for a call that wants a replica; give it back with :meth:`take` or
        :meth:`leave`."""
        ticket = object()
        self._tickets.append(ticket)
        return ticket

    def can_take(self, ticket: object, now: float | None = None) -> bool:
        """Whether the call holding ``ticket`` may take a replica now: one is free, and no
        older call waits for it."""
        return self._tickets.index(ticket) < self.free(now)

    def take(self, ticket: object) -> Member:
        """The longest-idle ready replica, now busy for the call holding ``ticket`` (which
        :meth:`can_take` allowed)."""
        self._tickets.remove(ticket)
        replica = self.ready.pop(0)
        self.busy[replica] = time.monotonic()
        return replica

    def leave(self, ticket: object) -> None:
        """The call holding ``ticket`` no longer waits (it failed, or gave up)."""
        self._tickets.remove(ticket)

    def waiting(self) -> int:
        return len(self._tickets)

    def newly_suspect(self, now: float | None = None) -> list[Member]:
        """Suspects not returned by an earlier call (each is returned once per call it runs)."""
        fresh = [r for r in self.suspects(now) if r not in self.reported]
        self.reported.update(fresh)
        return fresh

    # -- replicas coming and going -----------------------------------------------------------

    def add(self, replica: Member) -> None:
        """A replica became ready (started, regrouped)."""
        self.ready.append(replica)

    def done(self, replica: Member) -> float | None:
        """The call on ``replica`` ended, well: it is ready again. Returns how long the call
        ran, or None if the replica was not busy."""
        since = self.busy.pop(replica, None)
        self.reported.discard(replica)
        if since is None:
            return None
        self.ready.append(replica)
        return time.monotonic() - since

    def remove(self, replica: Member) -> bool:
        """``replica`` is lost or retired, busy or ready; True if it was here."""
        self.reported.discard(replica)
        if self.busy.pop(replica, None) is not None:
            return True
        if replica in self.ready:
            self.ready.remove(replica)
            return True
        return False

    def clear(self) -> list[Member]:
        """Every replica here, busy ones first; none is left."""
        replicas = [*self.busy, *self.ready]
        self.busy, self.ready = {}, []
        self.reported.clear()
        return replicas
