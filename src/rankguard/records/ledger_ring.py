"""The ledger's rings of recent operations: what each rank entered lately in each group, and
when it was seen completed, kept in the ledger's mapping after its group slots (see ``ledger``).

Each group slot has a ring of its own (``capacity``: the world's keeps its latest 512
operations, a sub-group's its latest 32) of 32-byte records, one per operation entered: when it
was entered, its entry number in the group, how many of the group's operations had been seen
completed at that moment (by any thread), and its kind. Its place is its entry number modulo the
capacity, so writing it needs no counter shared with anything: the thread that issues the
group's operations writes it in the same step as the slot's entry, with one ``pack_into`` and no
lock (see ``ledger._SlotWriter.step``); nothing else writes the ring.

When an operation was seen completed follows from the records without another write: a
group's operations complete in the order they were entered, so operation ``e`` was seen
completed by the entry time of the first later record that counts ``e`` done; for the operations
after the group's last record, the slot's count of completions and the time of its latest one
tell. (So a completion's time is when it was known at the latest, not the instant: the issuing
thread records completions as it enters the next operation, the sweeper within its lag.)

An asynchronous group's ring (NCCL's, read from torch's Flight Recorder) has records of its own
(``ASYNC_RECORD``, the same size and place): the rank's sampler thread writes them from the
recorder's entries (``runtime.fr_recent``), never the thread that issues the operations, with
what the recorder knows of each: when it was enqueued, its number (torch's), its state
(:class:`AsyncState`), when its device was seen starting and completing it, and the bytes of its
inputs. An operation the slot's completed count has passed reads completed, at the slot's time
of completion at the latest, whatever its record said when it was written.

A reader copies a ring at once and keeps the records whose entry number agrees with their place:
a record half written at the moment of the copy may show a wrong time, never a wrong order.
Times are ``time.monotonic()``, on the clock of every process of the machine; ``wall_offset``
turns them into wall-clock time for people.
"""

from __future__ import annotations

import enum
import math
import mmap
import struct
import time
from dataclasses import dataclass

# when it was entered, its entry number, completions of the group seen so far, its kind
RECORD = struct.Struct("<dQQB7x")
RECORD_SIZE = RECORD.size
# an asynchronous group's: when it was enqueued, its number, seconds from then to its start and
# to its completion (NaN: not known, or not yet), its inputs' bytes (NaN: not known), kind, state
ASYNC_RECORD = struct.Struct("<dQfffBB2x")
assert ASYNC_RECORD.size == RECORD_SIZE
WORLD_CAPACITY = 512  # powers of two: a record's place is ``entry & (capacity - 1)``
GROUP_CAPACITY = 32


def capacity(slot: int) -> int:
    """How many operations the ring of slot ``slot`` keeps (slot 0 is the world's)."""
    return WORLD_CAPACITY if slot == 0 else GROUP_CAPACITY


def offset(slot: int) -> int:
    """Where the ring of slot ``slot`` starts, from the start of the rings."""
    return 0 if slot == 0 else (WORLD_CAPACITY + (slot - 1) * GROUP_CAPACITY) * RECORD_SIZE


def size(slots: int) -> int:
    """Bytes the rings of ``slots`` slots take."""
    return offset(slots)


def clear(buf: mmap.mmap, base: int, slot: int) -> None:
    """Forget every record of slot ``slot``'s ring at ``base`` (its group counts anew)."""
    length = capacity(slot) * RECORD_SIZE
    buf[base:base + length] = bytes(length)


class AsyncState(enum.IntEnum):
    """Where an asynchronous group's operation stood when its record was written."""

    ENQUEUED = 0  # the CPU enqueued it; its device was not seen starting it (or not known)
    STARTED = 1  # its device started it
    COMPLETED = 2


@dataclass(frozen=True)
class RingRecord:
    """One recent operation of one group of one rank, as read from its ledger (the last three
    fields: an asynchronous group's only)."""

    entry: int  # its entry number in the group (``ledger.seq_of`` gives what people see)
    kind: int  # the operation's code (``ledger.op_name``)
    t_enter: float  # monotonic
    t_done: float | None  # monotonic; None while not seen completed
    state: AsyncState | None = None
    t_started: float | None = None  # monotonic; None: not seen (or not known)
    nbytes: int | None = None


def write_async(buf: mmap.mmap, base: int, slot: int, record: RingRecord) -> None:
    """Write an asynchronous group's ``record`` into slot ``slot``'s ring at ``base``, at its
    place (its entry number modulo the capacity). Only the group's one writer may call it."""
    def after(t: float | None) -> float:
        return math.nan if t is None else max(t - record.t_enter, 0.0)

    ASYNC_RECORD.pack_into(
        buf, base + (record.entry & (capacity(slot) - 1)) * RECORD_SIZE, record.t_enter,
        record.entry, after(record.t_started), after(record.t_done),
        math.nan if record.nbytes is None else float(record.nbytes), record.kind,
        AsyncState.ENQUEUED if record.state is None else record.state)


def read_async(buf: mmap.mmap, base: int, slot: int, done: int, t_done: float
               ) -> list[RingRecord]:
    """The records of an asynchronous group's ring (``write_async``), oldest first; ``done``
    and ``t_done``: the slot's completed count now and when it last moved (an operation it has
    passed reads completed by then, if its record did not say so)."""
    places = capacity(slot)
    raw = bytes(buf[base:base + places * RECORD_SIZE])
    found = []
    for index in range(places):
        t_enter, entry, started, finished, nbytes, kind, state = ASYNC_RECORD.unpack_from(
            raw, index * RECORD_SIZE)
        if not entry or entry & (places - 1) != index or state > AsyncState.COMPLETED:
            continue
        seen_done = None if math.isnan(finished) else t_enter + finished
        if seen_done is None and entry <= done:
            seen_done, state = max(t_done, t_enter), AsyncState.COMPLETED
        found.append(RingRecord(entry, kind, t_enter, seen_done, AsyncState(state),
                                None if math.isnan(started) else t_enter + started,
                                None if math.isnan(nbytes) else int(nbytes)))
    found.sort(key=lambda record: record.entry)
    return found


def read(buf: mmap.mmap, base: int, slot: int, done: int, t_done: float) -> list[RingRecord]:
    """The records of slot ``slot``'s ring at ``base``, oldest first, with their completion
    times (see the module doc); ``done`` and ``t_done``: the completions the slot records now,
    and the time of the latest."""
    places = capacity(slot)
    raw = bytes(buf[base:base + places * RECORD_SIZE])
    rows = []
    for index in range(places):
        row = RECORD.unpack_from(raw, index * RECORD_SIZE)
        if row[1] and row[1] & (places - 1) == index:
            rows.append(row)
    rows.sort(key=lambda row: row[1])
    times: list[float | None] = []
    waiting: list[int] = []  # rows not yet seen completed, oldest first
    for index, (t_enter, entry, done_then, _) in enumerate(rows):
        while waiting and rows[waiting[0]][1] <= done_then:
            times[waiting.pop(0)] = t_enter
        times.append(None)
        waiting.append(index)
    for index in waiting:
        if rows[index][1] <= done:
            times[index] = max(t_done, rows[index][0])
    return [RingRecord(entry, kind, t_enter, times[index])
            for index, (t_enter, entry, _, kind) in enumerate(rows)]


def wall_offset() -> float:
    """Add to a monotonic time of this machine to get wall-clock seconds since the epoch."""
    return time.time() - time.monotonic()
