"""Completions reach the ledger, for real gloo works: from the next operation at once (in the
same write as its entry) for a process's first operations, then at most ``REAP_AT - 1``
operations late; from the tracker's thread at most its lag late (soon after, for an operation
that lasts); and that thread sweeps once per lag while operations are short."""

import datetime
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

from rankguard.records import ledger
from rankguard.deadline import Deadline
from rankguard.runtime.completions import (EXACT_OPS, LAG_SHARE, MAX_LAG_S, MIN_LAG_S, REAP_AT,
                                           CompletionTracker, lag_for)

# How long a loaded 2-core machine may keep a ready thread from running, on top of a bound.
LOAD_SLACK_S = 2.0


@pytest.fixture
def world(tmp_path):
    """A one-rank ledger slot and gloo group."""
    path = str(tmp_path / "r0.ledger")
    ledger.create(path, world_size=1)
    slot = ledger.LedgerWriter(path).world()
    gloo = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=10))
    return slot, gloo, ledger.LedgerReader(path)


@pytest.fixture
def pair():
    """Rank 0 and rank 1 of a real two-rank gloo group, both in this process."""
    store = dist.HashStore()
    groups = [None, None]

    def make(rank):
        groups[rank] = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=30))

    threads = [threading.Thread(target=make, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert all(groups)
    return groups


def wait_done(reader, count, deadline):
    """The world slot as soon as it shows ``count`` completions, or as it is at ``deadline``."""
    world = reader.read().groups[0]
    while world.done < count and not deadline.passed():
        time.sleep(0.005)
        world = reader.read().groups[0]
    return world


def test_completed_works_are_marked_done_in_their_slot_and_released(world):
    slot, gloo, reader = world
    tracker = CompletionTracker(lag=MIN_LAG_S)
    for _ in range(50):
        tracker.enter(slot, ledger.OP_CODES["all_reduce"])
        tracker.add(slot, gloo.allreduce([torch.ones(4)]))
    got = wait_done(reader, 50, Deadline.after(MIN_LAG_S + LOAD_SLACK_S))
    assert (got.entered, got.done, got.waiting) == (50, 50, False)
    assert not tracker._pending
    tracker.close()
    assert not tracker._thread.is_alive()


def test_the_next_operation_marks_the_previous_one_done_without_the_thread(world):
    slot, gloo, reader = world
    tracker = CompletionTracker(lag=3600.0)  # the thread would not sweep within the test
    total = EXACT_OPS + 1 + 5 * REAP_AT
    for n in range(1, total + 1):
        assert tracker.enter(slot, ledger.OP_CODES["all_reduce"]) == n
        got = reader.read().groups[0]
        if n <= EXACT_OPS + 1:
            # the previous op, at once, in the write of this one's entry (one clock read)
            assert (got.entered, got.done) == (n, n - 1)
            assert n == 1 or got.t_done == got.t_enter
        else:
            # then every REAP_AT entries: at most REAP_AT - 1 completions not yet recorded
            assert got.entered == n and n - REAP_AT <= got.done <= n - 1, (n, got.done)
            assert got.done == n - 1 or got.t_done < got.t_enter
        work = gloo.allreduce([torch.ones(4)])
        tracker.add(slot, work)
        work.wait()
    assert len(tracker._pending) <= REAP_AT  # completed works are not kept beyond that
    tracker.flush()
    assert reader.read().groups[0].done == total
    tracker.close()


def test_a_completion_after_the_rank_stops_issuing_reaches_the_ledger_within_the_lag(
        tmp_path, pair):
    path = str(tmp_path / "r0.ledger")
    ledger.create(path, world_size=2)
    slot = ledger.LedgerWriter(path).world()
    reader = ledger.LedgerReader(path)
    lag = 0.3
    tracker = CompletionTracker(lag=lag)
    received = torch.zeros(1)
    tracker.enter(slot, ledger.OP_CODES["recv"])
    work = pair[0].recv([received], 1, 0)
    tracker.add(slot, work)
    time.sleep(lag * 2)  # the thread has swept at least once with the work still outstanding
    assert reader.read().groups[0].waiting
    pair[1].send([torch.ones(1)], 0, 0).wait()
    work.wait()
    completed = time.monotonic()
    got = wait_done(reader, 1, Deadline.after(lag + LOAD_SLACK_S))
    assert got.done == 1
    assert got.t_done - completed <= lag + LOAD_SLACK_S
    tracker.close()


def test_a_stream_of_short_operations_costs_one_sweep_per_lag(world):
    slot, gloo, reader = world
    lag = 0.1
    tracker = CompletionTracker(lag=lag)
    start = Deadline.after(1.0)
    issued = 0
    while not start.passed():  # short operations, one after the other, for a second
        tracker.enter(slot, ledger.OP_CODES["all_reduce"])
        work = gloo.allreduce([torch.ones(4)])
        tracker.add(slot, work)
        work.wait()
        issued += 1
    periods = (time.monotonic() - (start.at - 1.0)) / lag
    # one per lag; twice that leaves room for an operation that a loaded machine kept
    # outstanding across two sweeps (it is then checked every MIN_LAG_S until it completes)
    assert 1 <= tracker.sweeps <= 2 * periods + 2, (tracker.sweeps, periods, issued)
    assert issued > 10 * periods  # far fewer sweeps than operations: the point
    tracker.close()


def test_an_operation_outstanding_for_a_whole_lag_is_checked_often(world, pair):
    slot, _, reader = world
    lag = 0.25
    tracker = CompletionTracker(lag=lag)
    work = pair[0].recv([torch.zeros(1)], 1, 7)
    tracker.add(slot, work)
    time.sleep(1.0)
    # checked every MIN_LAG_S once it outlived a lag: more sweeps than one per lag could give
    assert tracker.sweeps > 1.0 / lag + 2, tracker.sweeps
    pair[1].send([torch.ones(1)], 0, 7).wait()
    work.wait()
    completed = time.monotonic()
    got = wait_done(reader, 1, Deadline.after(LOAD_SLACK_S))
    assert got.done == 1 and got.t_done - completed < lag  # not a whole lag late
    tracker.close()


def test_close_is_prompt_whatever_the_lag(world):
    slot, gloo, _ = world
    tracker = CompletionTracker(lag=3600.0)
    tracker.add(slot, gloo.allreduce([torch.ones(4)]))
    time.sleep(0.05)  # the thread now waits out its lag
    started = time.monotonic()
    tracker.close(timeout=LOAD_SLACK_S)
    assert not tracker._thread.is_alive()
    assert time.monotonic() - started < LOAD_SLACK_S
    assert not tracker._pending


@pytest.mark.parametrize("hang_timeout, lag", [
    (None, MAX_LAG_S),  # nobody judges the ledger against a time limit
    (10.0, min(MAX_LAG_S, 10.0 * LAG_SHARE)),  # the launcher's default
    (2.0, 2.0 * LAG_SHARE),
    (0.1, MIN_LAG_S),  # the smallest --hang-timeout: at least MIN_LAG_S between sweeps
    (1e9, MAX_LAG_S),
])
def test_the_lag_is_a_share_of_the_hang_timeout_within_bounds(hang_timeout, lag):
    assert lag_for(hang_timeout) == pytest.approx(lag)
    if hang_timeout is not None:
        assert lag_for(hang_timeout) <= max(hang_timeout * LAG_SHARE, MIN_LAG_S)


def test_ranks_under_the_launcher_get_the_lag_of_its_hang_timeout(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "1", "--hang-timeout", "2", "-m",
                         "tests.scripts.report_lag"])
    assert run.code == 0, run.stderr
    assert f"lag={lag_for(2.0)!r}" in run.stdout


def test_a_completion_of_another_group_is_recorded_in_its_own_slot(tmp_path):
    path = str(tmp_path / "r0.ledger")
    ledger.create(path, world_size=1)
    writer = ledger.LedgerWriter(path)
    world, sub = writer.world(), writer.add_group("sub", [0])
    reader = ledger.LedgerReader(path)
    gloo = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=10))
    tracker = CompletionTracker(lag=3600.0)  # the thread would not sweep within the test
    tracker.enter(sub, ledger.OP_CODES["broadcast"])
    work = gloo.broadcast([torch.ones(4)])
    tracker.add(sub, work)
    work.wait()
    tracker.enter(world, ledger.OP_CODES["all_reduce"])
    w, s = reader.read().groups
    assert (w.entered, w.done, s.entered, s.done) == (1, 0, 1, 1)
    tracker.close()


def test_the_thread_sleeps_while_nothing_is_outstanding_and_wakes_for_new_works(world):
    slot, gloo, reader = world
    tracker = CompletionTracker(lag=MIN_LAG_S)
    for count in (1, 2):
        work = gloo.allreduce([torch.ones(4)])
        tracker.add(slot, work)
        work.wait()
        assert wait_done(reader, count, Deadline.after(MIN_LAG_S + LOAD_SLACK_S)).done == count
        asleep = Deadline.after(LOAD_SLACK_S)
        while not tracker.asleep and not asleep.passed():
            time.sleep(0.005)
        assert tracker.asleep  # nothing outstanding: it waits for works, at no cost
        sweeps = tracker.sweeps
        time.sleep(10 * MIN_LAG_S)
        assert tracker.sweeps == sweeps
    tracker.close()
    assert not tracker._thread.is_alive()


def test_issue_enters_starts_and_watches_the_operation_in_one_call(world):
    slot, gloo, reader = world
    tracker = CompletionTracker(lag=3600.0)  # the thread would not sweep within the test
    tensor = torch.ones(4)
    work = tracker.issue(slot, ledger.OP_CODES["all_reduce"], gloo.allreduce, ([tensor],), {})
    work.wait()
    got = reader.read().groups[0]
    assert (got.entered, got.done, got.waiting) == (1, 0, True)  # entered, not yet recorded
    assert tracker.flush()
    got = reader.read().groups[0]
    assert (got.entered, got.done, got.waiting) == (1, 1, False)
    assert not tracker._pending
    tracker.close()


def test_an_operation_its_backend_refuses_is_recorded_done_and_the_error_raised(world):
    slot, gloo, reader = world
    tracker = CompletionTracker(lag=3600.0)
    options = dist.BroadcastOptions()
    options.rootRank = 5  # a one-rank group: gloo refuses it at once
    with pytest.raises(RuntimeError, match="invalid root rank"):
        tracker.issue(slot, ledger.OP_CODES["broadcast"], gloo.broadcast,
                      ([torch.ones(4)], options), {})
    got = reader.read().groups[0]
    assert (got.entered, got.done, got.waiting) == (1, 1, False)  # not in progress
    assert not tracker._pending
    tracker.close()



def test_the_works_held_at_exit_are_never_destroyed(world):
    # released by close() at exit, the last reference to a work could be gloo's worker
    # thread's: destroying it during finalization, the worker aborted the rank (SIGABRT,
    # "terminate called without an active exception", about 1 exit in 15 under rankguard run)
    slot, gloo, _ = world
    tracker = CompletionTracker(lag=3600.0)
    work = gloo.allreduce([torch.ones(4)])
    tracker.add(slot, work)
    work.wait()
    held = sys.getrefcount(work)
    tracker.close(timeout=LOAD_SLACK_S)
    assert not tracker._pending
    assert sys.getrefcount(work) == held  # the tracker's reference is now one for good
