"""Progress of a rank's process: from its ledger when it enters operations, from /proc only
while its ledger is quiet and some rank waits. Fake ledger snapshots, real processes."""

import signal
import subprocess
import sys
import time

import pytest

from rankguard.launcher.progress import ProgressTracker
from rankguard.records.ledger import GroupProgress, RankProgress, group_key

WORLD = group_key("world")


def snap(entered: int, done: int, t_enter: float) -> RankProgress:
    """The ledger of a rank of a two-rank world."""
    group = GroupProgress(WORLD, 0b11, True, 2, entered, done, "all_reduce", t_enter, t_enter)
    return RankProgress(0, 0, 0, False, 0.0, 0.0, (group,))


@pytest.fixture
def process():
    """Start a process of a kind: ``sleeping``, ``busy`` or ``stopped``; killed after the test."""
    started = []

    def start(kind: str) -> int:
        code = "while True: pass" if kind == "busy" else "import time; time.sleep(60)"
        proc = subprocess.Popen([sys.executable, "-c", code])
        started.append(proc)
        if kind == "stopped":
            proc.send_signal(signal.SIGSTOP)
        time.sleep(0.2)  # past the interpreter's start-up, which counts as progress
        return proc.pid

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_rank_that_keeps_entering_operations_progresses_without_a_proc_read(process):
    tracker = ProgressTracker()
    now = time.monotonic()
    tracker.start(1, process("stopped"), now)  # /proc would say stopped: it is never read
    for n in range(1, 6):
        now += 0.2
        tracker.sample(now, {0: snap(n + 1, n, now), 1: snap(n, n - 1, now - 0.05)})
        assert tracker.idle_for(1, now) == pytest.approx(0.05)
        assert not tracker.stopped(1)
    assert tracker.proc_reads == 0


def test_a_quiet_rank_is_not_read_while_no_rank_waits(process):
    tracker = ProgressTracker()
    now = time.monotonic()
    tracker.start(1, process("stopped"), now)
    for _ in range(5):
        now += 0.2
        tracker.sample(now, {0: snap(3, 3, now - 5), 1: snap(3, 3, now - 5)})
    assert tracker.proc_reads == 0
    assert not tracker.stopped(1)


@pytest.mark.parametrize("kind, progressing, stopped", [
    ("sleeping", False, False),
    ("busy", True, False),
    ("stopped", False, True),
])
def test_a_quiet_rank_that_a_peer_waits_for_is_read_from_proc(process, kind, progressing,
                                                              stopped):
    tracker = ProgressTracker()
    start = time.monotonic()
    tracker.start(1, process(kind), start - 30)
    wait_began = start - 10  # rank 0 waits in all_reduce #3 that rank 1 never entered
    ledgers = {0: snap(4, 3, wait_began), 1: snap(3, 3, start - 20)}
    tracker.sample(start - 0.2, ledgers)  # takes rank 1's last entry as progress, at its time
    assert tracker.proc_reads == 0
    tracker.sample(start, ledgers)
    time.sleep(0.3)
    now = time.monotonic()
    tracker.sample(now, ledgers)
    assert tracker.proc_reads == 2
    assert tracker.stopped(1) is stopped
    # counted as progressing until the wait began (it was not looked at before), then as /proc says
    assert tracker.idle_for(1, now) == pytest.approx(0.0 if progressing else now - wait_began)


def test_a_rank_whose_ledger_moves_again_forgets_what_proc_said(process):
    tracker = ProgressTracker()
    now = time.monotonic()
    tracker.start(1, process("stopped"), now)
    waiting = {0: snap(4, 3, now - 1)}
    tracker.sample(now - 0.2, {**waiting, 1: snap(3, 3, now - 2)})
    tracker.sample(now, {**waiting, 1: snap(3, 3, now - 2)})
    assert tracker.stopped(1)
    tracker.sample(now + 0.2, {**waiting, 1: snap(4, 3, now + 0.1)})
    assert not tracker.stopped(1)
    assert tracker.idle_for(1, now + 0.2) == pytest.approx(0.1)
    assert tracker.proc_reads == 1


def async_snap(enqueued: int, completed: int, t_enter: float, t_done: float) -> RankProgress:
    """The ledger of an NCCL rank: its CPU runs ahead of its completions."""
    group = GroupProgress(WORLD, 0b11, True, 2, enqueued, completed, "all_reduce", t_enter,
                          t_done, completed, True)
    return RankProgress(0, 0, 0, False, 0.0, 0.0, (group,))


def test_an_nccl_group_with_operations_pending_is_not_a_wait_while_it_completes_them(process):
    tracker = ProgressTracker()
    now = time.monotonic()
    tracker.start(1, process("stopped"), now)  # /proc would say stopped: it is never read
    for n in range(1, 6):
        now += 0.2
        # both enqueued far ahead and complete as they go; rank 1 enqueues nothing more
        tracker.sample(now, {0: async_snap(50 + n, n, now, now), 1: async_snap(50, n, 1.0, now)})
    assert tracker.proc_reads == 0


def test_an_nccl_group_whose_completions_stand_still_is_a_wait_from_its_last_one(process):
    tracker = ProgressTracker()
    now = time.monotonic()
    tracker.start(1, process("sleeping"), now - 30)
    stalled = now - 10  # rank 0's completions stopped then, with operations pending
    ledgers = {0: async_snap(60, 50, stalled, stalled), 1: async_snap(50, 50, now - 20, now - 20)}
    tracker.sample(now - 0.2, ledgers)  # takes rank 1's last entry as progress, at its time
    tracker.sample(now, ledgers)
    time.sleep(0.3)
    later = time.monotonic()
    tracker.sample(later, ledgers)
    assert tracker.proc_reads == 2
    assert tracker.idle_for(1, later) == pytest.approx(later - stalled)
