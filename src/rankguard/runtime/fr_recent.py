"""The recent-operations ring of an asynchronous group (NCCL's), from torch's Flight Recorder.

For a group rankguard wraps, the thread that issues its operations writes each one into the
ledger's ring (``ledger_ring``) as it enters it. An asynchronous group's operations are left
alone on that thread (issue 29: at most 1 us per operation there); the rank's sampler thread
(``async_groups``) writes their records instead, out of the recorder's entries it reads anyway:

- when a group stalls (an operation pending, completions standing still for
  ``margins.ASYNC_STALL_S``), from the entries it reads to learn the kind of the operation
  waited in;
- once before anything aborts the group (a SIGTERM teardown, a deadline, a notice), from the
  full dump it keeps for torch's analyser;
- once at the rank's clean exit.

No tick reads entries for the ring alone: a tick costs what it cost before, plus one pair kept
per group whose completions moved (:class:`CompletionTimes`).

Times: torch stamps entries on the wall clock (ns); the ring keeps the machine's monotonic clock
(``wall_offset``: wall minus monotonic, read once per conversion). A completion torch did not
time (gloo never does; NCCL does when its watchdog sees it) takes the first tick at which the
sampler saw the group's completed count reach it (``seen completed by``), else the moment of the
conversion.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

from ..records import ledger as _ledger
from ..records import ledger_ring
from ..records.ledger_ring import AsyncState, RingRecord
from .fr_progress import Entry


class CompletionTimes:
    """When the sampler saw one group's completed count move: ``(count, monotonic time)``
    pairs, the latest ``capacity`` (one per tick that moved it, so they cover at least that
    many operations: every one its ring keeps)."""

    def __init__(self, capacity: int) -> None:
        self._seen: deque[tuple[int, float]] = deque(maxlen=capacity)

    def saw(self, completed: int, at: float) -> None:
        """The group's completed count read ``completed`` at ``at``."""
        if not self._seen or completed > self._seen[-1][0]:
            self._seen.append((completed, at))
        elif completed < self._seen[-1][0]:  # a new group in the slot: counts start anew
            self._seen.clear()
            self._seen.append((completed, at))

    def by(self, seq: int) -> float | None:
        """When operation ``seq`` was first seen completed, at the latest (the oldest pair
        kept bounds every operation before it too); None: not seen completed yet."""
        for count, at in self._seen:  # oldest first; a ring's worth at most
            if count >= seq:
                return at
        return None


def records(entries: Iterable[Entry], pg_id: int, capacity: int, completed: int,
            started: int, times: CompletionTimes, now: float, wall_offset: float
            ) -> list[RingRecord]:
    """The ring records of group ``pg_id`` from the recorder's ``entries`` (oldest first): its
    latest ``capacity`` operations. ``completed`` and ``started``: the group's counts as the
    sampler last read them (-1: not known), which mark an operation completed or started when its
    entry lags; ``times``: when completions were seen; ``now``: the monotonic time of the read;
    ``wall_offset``: wall minus monotonic. Pure."""
    mine = [entry for entry in entries if entry.pg_id == pg_id and entry.seq > 0]
    kept: dict[int, Entry] = {}
    for entry in mine:  # a number seen twice (a later group's entry): the later one
        kept[entry.seq] = entry
    found = []
    for seq in sorted(kept)[-capacity:]:
        entry = kept[seq]
        t_enter = entry.created_ns / 1e9 - wall_offset if entry.created_ns else now
        done = entry.completed or seq <= completed
        t_done = None
        if done:
            timed = entry.completed_ns / 1e9 - wall_offset if entry.completed_ns else None
            seen = times.by(seq)
            t_done = min(t for t in (timed, seen, now) if t is not None)
            t_done = max(t_done, t_enter)
        t_started = entry.started_ns / 1e9 - wall_offset if entry.started_ns else None
        began = done or entry.state == "started" or t_started is not None or \
            0 < seq <= started
        state = AsyncState.COMPLETED if done else \
            AsyncState.STARTED if began else AsyncState.ENQUEUED
        found.append(RingRecord(seq, _ledger.OP_CODES.get(entry.kind, _ledger.OP_CODES["none"]),
                                t_enter, t_done, state,
                                None if t_started is None else max(t_started, t_enter),
                                entry.nbytes))
    return found


def capacity(is_world: bool) -> int:
    """How many operations the ring of a group keeps (the world's slot is slot 0)."""
    return ledger_ring.capacity(0 if is_world else 1)
