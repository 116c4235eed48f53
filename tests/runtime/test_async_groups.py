"""The sampler's rules for an asynchronous group's record (pure; the sampler itself runs in
real ranks in tests/launcher/test_recorded_groups.py and the GPU set), and how it takes the
supervisor's notices from a real ledger."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from rankguard.records.ledger import (NOTICE_DIED, NOTICE_HUNG, OP_CODES, LedgerWriter,
                                      create, post_notice)
from rankguard.margins import ASYNC_STALL_S
from rankguard.runtime.async_groups import (MAX_TICK_S, MIN_TICK_S, AsyncGroupSampler,
                                            Published, advance, kind_wanted, overdue, tick_for,
                                            with_retired)
from rankguard.runtime.fr_progress import GroupCounts

AR = OP_CODES["all_reduce"]
BEFORE = Published(enqueued=10, started=9, completed=8, t_enter=1.0, t_done=2.0, kind=AR,
                   kind_of=9, pending_since=2.0, read_at=10)
# gloo: torch says #19 completed, the entries showed #20 completed, #21 the first not
RETIRED = Published(24, -1, 20, 1.0, 2.0, AR, 21, 2.0, retired=20)

ADVANCE = {
    "a group seen for the first time has both times now; torch's -1 (none) reads 0":
        (None, GroupCounts(-1, -1, -1), True, Published(0, 0, 0, 5.0, 5.0)),
    "with timing off, started is not known (-1) whatever torch says; it waits from now":
        (None, GroupCounts(3, 2, 1), False, Published(3, -1, 1, 5.0, 5.0, pending_since=5.0)),
    "nothing moved: the times stay":
        (BEFORE, GroupCounts(10, 9, 8), True, BEFORE),
    "a new enqueue moves the enqueue time only: the same operation is waited for":
        (BEFORE, GroupCounts(11, 9, 8), True,
         Published(11, 9, 8, 5.0, 2.0, AR, 9, 2.0, read_at=10)),
    "a completion moves the completion time, and the next operation is waited for from now":
        (BEFORE, GroupCounts(10, 10, 9), True,
         Published(10, 10, 9, 1.0, 5.0, AR, 9, 5.0, read_at=10)),
    "the last completion leaves nothing waited for":
        (BEFORE, GroupCounts(10, 10, 10), True,
         Published(10, 10, 10, 1.0, 5.0, AR, 9, 0.0, read_at=10)),
    "a start alone moves no time (the rules wait on completions)":
        (BEFORE, GroupCounts(10, 10, 8), True,
         Published(10, 10, 8, 1.0, 2.0, AR, 9, 2.0, read_at=10)),
    "a new group in the same slot (fewer counts) is a move too":
        (BEFORE, GroupCounts(2, 2, 1), True, Published(2, 2, 1, 5.0, 5.0, AR, 9, 5.0)),
    "torch's gloo count standing behind what the entries showed completed is not believed":
        (RETIRED, GroupCounts(24, -1, 19), False, RETIRED),
    "torch's count passing what the entries showed is believed":
        (RETIRED, GroupCounts(24, -1, 22), False,
         Published(24, -1, 22, 1.0, 5.0, AR, 21, 5.0, retired=20)),
    "what the entries showed is forgotten with the group (its enqueued count went back)":
        (RETIRED, GroupCounts(3, -1, 1), False,
         Published(3, -1, 1, 5.0, 5.0, AR, 21, 5.0)),
}


@pytest.mark.parametrize("before, counts, timing, after", ADVANCE.values(), ids=ADVANCE.keys())
def test_times_move_where_counts_moved(before, counts, timing, after):
    assert advance(before, counts, timing, 5.0) == after


GLOO_BEHIND = Published(24, -1, 19, 1.0, 2.0, pending_since=2.0)  # torch says #19 completed
RETIRE = {
    "the entries show more completed than torch's count: the group got that far, and its wait "
    "in the next one is dated from now": (GLOO_BEHIND, 20, replace(GLOO_BEHIND, completed=20,
                                                                   retired=20, pending_since=5.0)),
    "the entries show every operation enqueued completed: nothing is waited for":
        (replace(GLOO_BEHIND, enqueued=20), 20,
         replace(GLOO_BEHIND, enqueued=20, completed=20, retired=20, pending_since=0.0)),
    "entries read after the counts, ahead of the enqueued count, raise it no further than it":
        (replace(GLOO_BEHIND, enqueued=20), 23,
         replace(GLOO_BEHIND, enqueued=20, completed=20, retired=23, pending_since=0.0)),
    "the entries agree with torch's count: the count and the wait stay":
        (GLOO_BEHIND, 19, replace(GLOO_BEHIND, retired=19)),
    "the group has no entry in the ring: nothing changes": (GLOO_BEHIND, None, GLOO_BEHIND),
    "an older reading of the entries lowers nothing": (RETIRED, 18, RETIRED),
}


@pytest.mark.parametrize("record, retired, after", RETIRE.values(), ids=RETIRE.keys())
def test_the_completed_count_is_raised_to_what_the_entries_show(record, retired, after):
    assert with_retired(record, retired, 5.0) == after


KIND = {
    "nothing pending: nothing to learn": (Published(8, 8, 8, 0.0, 0.0), 10.0, 0),
    "pending, completions moved lately: not yet": (Published(9, 9, 8, 0.0, 9.9), 10.0, 0),
    "pending and stalled: the first not completed":
        (Published(12, 9, 8, 0.0, 10.0 - ASYNC_STALL_S), 10.0, 9),
    "its kind already learnt: not again": (BEFORE, 2.0 + ASYNC_STALL_S, 0),
    "a later operation stalled: learn it": (Published(12, 11, 10, 0.0, 0.0, AR, 9), 10.0, 11),
    "torch's completed count lags the entries, which showed a later one: not again":
        (Published(12, 9, 8, 0.0, 0.0, AR, 11, read_at=12), 10.0, 0),
    "operations enqueued since the entries were read: read again (on NCCL a later one done "
    "shows the pending one done: one captured in a CUDA graph never completes)":
        (replace(BEFORE, enqueued=12), 10.0, 9),
}


@pytest.mark.parametrize("record, now, wanted", KIND.values(), ids=KIND.keys())
def test_the_kind_is_learnt_once_per_stalled_operation(record, now, wanted):
    assert kind_wanted(record, now) == wanted


@pytest.mark.parametrize("lag, tick", [(0.02, MIN_TICK_S), (0.1, 0.1), (1.0, MAX_TICK_S)])
def test_the_tick_follows_the_completion_lag_within_bounds(lag, tick):
    assert tick_for(lag) == tick


WAITING = Published(12, 9, 8, 0.0, 0.0, pending_since=10.0)  # waits for #9 since 10.0
OVERDUE = {
    "nothing pending: never overdue": (Published(8, 8, 8, 0.0, 0.0), 99.0, 1.0, 1.0, False),
    "no deadline in force": (WAITING, 99.0, None, None, False),
    "waited less than the per-operation deadline": (WAITING, 12.9, 3.0, None, False),
    "waited the per-operation deadline": (WAITING, 13.0, 3.0, None, True),
    "the main thread's deadline passed while it is pending": (WAITING, 11.0, None, 11.0, True),
    "the main thread's deadline is still ahead": (WAITING, 11.0, 3.0, 11.5, False),
}


@pytest.mark.parametrize("record, now, per_op_s, limit_at, expected", OVERDUE.values(),
                         ids=OVERDUE.keys())
def test_an_operation_is_overdue_once_it_waited_past_a_deadline(record, now, per_op_s,
                                                                  limit_at, expected):
    assert overdue(record, now, per_op_s, limit_at) is expected


def test_each_notice_of_the_supervisor_is_taken_once_and_the_next_after_a_regroup(tmp_path):
    # a pool's rank lives through many heals: a notice after the first regroup is taken too
    path = str(tmp_path / "ledger")
    create(path, 2)  # as the supervisor makes it
    ledger = LedgerWriter(path)
    taken = []
    sampler = AsyncGroupSampler(ledger, [], MIN_TICK_S, False, lambda name: None,
                                on_notice=lambda notice, waiting: taken.append(notice))
    sampler.sample()
    post_notice(path, NOTICE_DIED, 1)
    sampler.sample()
    sampler.sample()
    assert taken == [("died", 1)]
    ledger.clear_notice()  # what regroup does
    sampler.sample()
    post_notice(path, NOTICE_HUNG, 0)
    sampler.sample()
    assert taken == [("died", 1), ("hung", 0)]


# A one-rank gloo group of torch's recorder, watched by a real sampler and ledger; the
# sampler's thread is late for its tick when stop() is called (a loaded machine: the launcher
# took a rank that left with stale counts for one that left before its peers' operations).
LATE_TICK = """
import sys, threading, time
import torch
import torch.distributed as dist
from rankguard.records.ledger import LedgerReader, LedgerWriter, create
from rankguard.runtime.async_groups import STOP_WAIT_S, AsyncGroupSampler, torch_members
from rankguard.runtime.fr_progress import FlightRecorderReader, Recorder

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
create(sys.argv[1], 1)
late = threading.Event()

def clock():
    if late.is_set() and threading.current_thread() is not threading.main_thread():
        late.clear()
        time.sleep(STOP_WAIT_S * 1.5)  # longer than stop() waits for the thread
    return time.monotonic()

sampler = AsyncGroupSampler(LedgerWriter(sys.argv[1]), [FlightRecorderReader(Recorder.CPU)],
                            0.05, False, torch_members, clock=clock)
sampler.start()
dist.all_reduce(torch.ones(4))
time.sleep(0.3)  # published: 1
late.set()
time.sleep(0.2)  # the thread is in its late tick
for _ in range(5):
    dist.all_reduce(torch.ones(4))
sampler.stop()
print("LEFT_WITH", [g.entered for g in LedgerReader(sys.argv[1]).read().groups], flush=True)
"""


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_a_rank_leaves_with_its_last_counts_when_the_samplers_thread_is_late(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "late_tick.py"
    script.write_text(LATE_TICK)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "ledger")],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TORCH_FR_BUFFER_SIZE": "2000"})
    assert done.returncode == 0, done.stderr
    assert "LEFT_WITH [6]" in done.stdout, done.stdout + done.stderr
