"""The recent-operations ring of an asynchronous group: torch's Flight Recorder entries read
(``fr_progress.entry_of``), turned into ring records (``fr_recent.records``), written to and read
back from a real ledger (pure tables; the sampler writes them in real ranks in
tests/launcher/test_recorded_groups.py)."""

from __future__ import annotations

import math

import pytest

from rankguard.records import ledger as _ledger
from rankguard.records import ledger_ring
from rankguard.records.ledger_ring import AsyncState, RingRecord
from rankguard.runtime import fr_progress, fr_recent
from rankguard.runtime.fr_progress import Entry

AR, BC = _ledger.OP_CODES["all_reduce"], _ledger.OP_CODES["broadcast"]
GLOO = {"pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": "7",
        "profiling_name": "gloo:all_reduce", "time_created_ns": "1800000000500000000",
        "time_discovered_started_ns": "0", "time_discovered_completed_ns": "0",
        "input_sizes": [[1024]], "input_dtypes": ["Float"], "state": "scheduled",
        "retired": True}
NCCL = {"pg_id": 1, "process_group": ("3", "sub"), "collective_seq_id": 2,
        "profiling_name": "nccl:_allgather_base", "time_created_ns": 1_800_000_000_000_000_000,
        "time_discovered_started_ns": 1_800_000_000_250_000_000,
        "time_discovered_completed_ns": None, "input_sizes": [[2, 3], [4]],
        "input_dtypes": ["BFloat16", "Long"], "state": "started", "retired": False}

ENTRIES = {
    "a gloo entry (JSON: numbers as strings) retired without times is completed":
        (GLOO, Entry(0, "0", 7, "all_reduce", "scheduled", 1800000000500000000, True, 0, 0,
                     4096)),
    "an NCCL entry (pickle: None for no time) started on the device, sizes over every input":
        (NCCL, Entry(1, "3", 2, "all_gather_into_tensor", "started",
                     1_800_000_000_000_000_000, False, 1_800_000_000_250_000_000, 0,
                     2 * 3 * 2 + 4 * 8)),
    "a dtype not known leaves the size unknown":
        ({**GLOO, "input_dtypes": ["NewType"]}, Entry(0, "0", 7, "all_reduce", "scheduled",
                                                      1800000000500000000, True, 0, 0, None)),
    "sizes that do not match their dtypes leave it unknown":
        ({**GLOO, "input_dtypes": []}, Entry(0, "0", 7, "all_reduce", "scheduled",
                                             1800000000500000000, True, 0, 0, None)),
    "an NCCL entry torch marked completed is completed":
        ({**NCCL, "state": "completed", "time_discovered_completed_ns": 1_800_000_001_000_000_000},
         Entry(1, "3", 2, "all_gather_into_tensor", "completed", 1_800_000_000_000_000_000, True,
               1_800_000_000_250_000_000, 1_800_000_001_000_000_000, 44)),
}


@pytest.mark.parametrize("raw, entry", ENTRIES.values(), ids=ENTRIES.keys())
def test_a_recorder_entry_is_read_with_its_state_times_and_bytes(raw, entry):
    assert fr_progress.entry_of(raw) == entry


WALL = 1_800_000_000.0  # wall minus monotonic: monotonic = wall - WALL
NOW = 100.0


def _entry(seq: int, at: float, pg_id: int = 0, kind: str = "all_reduce", done: bool = False,
           state: fr_progress.OpState = "scheduled", started: float = 0.0,
           completed: float = 0.0, nbytes: int | None = 8) -> Entry:
    ns = lambda t: int(round((t + WALL) * 1e9)) if t else 0  # noqa: E731
    return Entry(pg_id, "0", seq, kind, state, ns(at), done, ns(started), ns(completed), nbytes)


def _times(*seen: tuple[int, float]) -> fr_recent.CompletionTimes:
    times = fr_recent.CompletionTimes(8)
    for completed, at in seen:
        times.saw(completed, at)
    return times


def _record(seq: int, at: float, done: float | None, state: AsyncState,
            started: float | None = None, kind: int = AR, nbytes: int | None = 8) -> RingRecord:
    return RingRecord(seq, kind, at, done, state, started, nbytes)


RECORDS = {
    "gloo: a retired entry is completed by the first tick that saw the count reach it; the one "
    "waited in is only enqueued":
        ([_entry(1, 10.0, done=True), _entry(2, 11.0, done=True), _entry(3, 12.0)], 0, 2, -1,
         _times((0, 9.0), (1, 10.5), (2, 11.5)),
         [_record(1, 10.0, 10.5, AsyncState.COMPLETED), _record(2, 11.0, 11.5,
                                                                AsyncState.COMPLETED),
          _record(3, 12.0, None, AsyncState.ENQUEUED)]),
    "a completion torch timed wins over a later tick; none is before its enqueue":
        ([_entry(1, 10.0, done=True, completed=10.2), _entry(2, 11.0, done=True,
                                                               completed=10.9)],
         0, 2, -1, _times((2, 12.0)),
         [_record(1, 10.0, 10.2, AsyncState.COMPLETED), _record(2, 11.0, 11.0,
                                                                AsyncState.COMPLETED)]),
    "an entry retired before the count reached it is completed by the read":
        ([_entry(3, 12.0, done=True)], 0, 2, -1, _times((2, 11.5)),
         [_record(3, 12.0, NOW, AsyncState.COMPLETED)]),
    "an entry torch's count passed is completed though the entry lags":
        ([_entry(2, 11.0)], 0, 2, -1, _times((2, 11.5)),
         [_record(2, 11.0, 11.5, AsyncState.COMPLETED)]),
    "NCCL with timing: started on the device, with its time; or by the started count":
        ([_entry(4, 13.0, state="started", started=13.5), _entry(5, 14.0)], 0, 3, 5,
         _times((3, 12.0)),
         [_record(4, 13.0, None, AsyncState.STARTED, started=13.5),
          _record(5, 14.0, None, AsyncState.STARTED)]),
    "another group's entries are left out, and the kind comes from each entry":
        ([_entry(1, 10.0, pg_id=1), _entry(1, 10.1, kind="broadcast")], 0, 0, -1, _times(),
         [_record(1, 10.1, None, AsyncState.ENQUEUED, kind=BC)]),
    "a kind the ledger does not know is none; an unknown size stays unknown":
        ([_entry(1, 10.0, kind="coalesced", nbytes=None)], 0, 0, -1, _times(),
         [_record(1, 10.0, None, AsyncState.ENQUEUED, kind=_ledger.OP_CODES["none"],
                  nbytes=None)]),
}


@pytest.mark.parametrize("entries, pg_id, completed, started, times, expected",
                         RECORDS.values(), ids=RECORDS.keys())
def test_entries_become_ring_records_with_their_state_and_times(entries, pg_id, completed,
                                                                started, times, expected):
    found = fr_recent.records(entries, pg_id, 32, completed, started, times, NOW, WALL)
    assert [(r.entry, r.kind, r.state, r.nbytes) for r in found] == \
        [(r.entry, r.kind, r.state, r.nbytes) for r in expected]
    for got, want in zip(found, expected):
        for field in ("t_enter", "t_done", "t_started"):
            a, b = getattr(got, field), getattr(want, field)
            assert (a is None) == (b is None) and (a is None or math.isclose(a, b, abs_tol=1e-6)), \
                (field, got, want)


def test_only_a_rings_worth_of_the_latest_operations_is_kept():
    entries = [_entry(seq, float(seq), done=True) for seq in range(1, 41)]
    found = fr_recent.records(entries, 0, 32, 40, -1, _times((40, 50.0)), NOW, WALL)
    assert [r.entry for r in found] == list(range(9, 41))


TIMES = {
    "not seen completed yet": ([(2, 1.0)], 3, None),
    "the first tick whose count reached it": ([(2, 1.0), (5, 2.0), (9, 3.0)], 4, 2.0),
    "before the oldest pair kept: by the oldest, at the latest": ([(5, 2.0)], 1, 2.0),
    "a lower count is a new group: it starts anew": ([(5, 2.0), (1, 3.0)], 1, 3.0),
}


@pytest.mark.parametrize("seen, seq, at", TIMES.values(), ids=TIMES.keys())
def test_a_completion_is_timed_by_the_first_tick_that_saw_it(seen, seq, at):
    assert _times(*seen).by(seq) == at


def test_the_ring_of_an_asynchronous_slot_reads_back_what_the_sampler_kept(tmp_path):
    path = str(tmp_path / "ledger")
    _ledger.create(path, 2)
    writer = _ledger.LedgerWriter(path)
    slot = writer.add_group("sub", [0, 1])
    assert slot is not None
    slot.publish(AR, 3, -1, 1, 10.0, 11.0)  # the slot says: #1 completed, at 11.0
    slot.keep([_record(1, 10.0, None, AsyncState.ENQUEUED),  # kept before it completed
               _record(2, 10.5, None, AsyncState.STARTED, started=10.6, nbytes=None),
               _record(3, 10.7, None, AsyncState.ENQUEUED)])
    reader = _ledger.LedgerReader(path)
    try:
        found = reader.recent()
    finally:
        reader.close()
    # torch's numbers, not the ledger's entries (no init_process_group entry)
    assert [(op.seq, op.op, op.state, op.t_done, op.nbytes) for op in found] == [
        (1, "all_reduce", AsyncState.COMPLETED, 11.0, 8),
        (2, "all_reduce", AsyncState.STARTED, None, None),
        (3, "all_reduce", AsyncState.ENQUEUED, None, 8)]
    assert found[1].t_started is not None and math.isclose(found[1].t_started, 10.6,
                                                             abs_tol=1e-5)
