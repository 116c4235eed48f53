"""Frozen, busy, waiting outside the job or stopped: the rule that judges a quiet rank's process
tree between two /proc samples (``progress.judge``), table-driven over fake samples (no
processes; milliseconds). The samples a real process gives are in tests/processes/test_proc_waits.py, and whole
runs in test_stragglers.py."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from rankguard.launcher.progress import BUSY_SHARE, POLL_S, Seen, judge
from rankguard.processes.proc_waits import Call, Fd, ThreadWait, TreeSample

INTERVAL = 0.2

LOCK = ThreadWait(100, "S", Call.FUTEX, what="futex")
SLEEP = ThreadWait(100, "S", Call.SLEEP, ends_in=3000.0, what="clock_nanosleep")
GLOO_LOOP = ThreadWait(101, "S", Call.EPOLL, (Fd.JOB, Fd.OWN, Fd.OUTSIDE), what="epoll_wait")
OWN_PIPE = ThreadWait(102, "S", Call.FDS, (Fd.OWN,), what="read on its own pipe")
IDLE_HELPERS = (GLOO_LOOP, OWN_PIPE, ThreadWait(103, "S", Call.FUTEX))


@dataclass
class Case:
    main: ThreadWait
    seen: Seen
    helpers: tuple[ThreadWait, ...] = IDLE_HELPERS
    cpu_share: float = 0.0  # of a core, over the interval, in the whole tree
    children: tuple[int, ...] = ()
    disk_wait: tuple[int, ...] = ()
    stopped: bool = False
    switches_moved: bool = True  # the main thread's context switches since the last sample
    stopped_children: tuple[int, ...] = ()
    poll_s: float = POLL_S


CASES = {
    # frozen: positive evidence, no CPU anywhere in the tree
    "a main thread deadlocked on a lock, helpers idle, is frozen": Case(LOCK, Seen.FROZEN),
    "a main thread in a long plain sleep is frozen": Case(SLEEP, Seen.FROZEN),
    "a plain sleep is frozen even while a helper thread reads a socket outside the job": Case(
        SLEEP, Seen.FROZEN,
        (ThreadWait(104, "S", Call.FDS, (Fd.OUTSIDE,), what="recvfrom on socket"),)),
    "a main thread blocked reading the job's store is frozen": Case(
        ThreadWait(100, "S", Call.FDS, (Fd.JOB,), what="recvfrom"), Seen.FROZEN),
    "a main thread in an event loop over the job's sockets only is frozen": Case(
        ThreadWait(100, "S", Call.EPOLL, (Fd.JOB, Fd.OWN)), Seen.FROZEN),
    "a lock wait whose context switches moved (a stack request woke it) is still frozen": Case(
        LOCK, Seen.FROZEN, switches_moved=True),
    "a long sleep whose context switches moved (a stack request) is still frozen": Case(
        SLEEP, Seen.FROZEN, switches_moved=True),
    "CPU below the busy share in the whole tree (a probe's dump) is frozen": Case(
        LOCK, Seen.FROZEN, cpu_share=BUSY_SHARE / 2),
    "idle children that the main thread does not wait on (data loader workers) are frozen": Case(
        LOCK, Seen.FROZEN, children=(200, 201)),
    "a helper's timed poll of its children's pipes (DataLoader pin-memory) is no evidence": Case(
        LOCK, Seen.FROZEN, (ThreadWait(104, "S", Call.FDS, (Fd.CHILD, Fd.CHILD), ends_in=5.0),),
        children=(200, 201)),
    "a helper blocked on a child's pipe without a timeout is outside": Case(
        LOCK, Seen.OUTSIDE, (ThreadWait(104, "S", Call.FDS, (Fd.CHILD,)),), children=(200,)),
    "a helper polling with a timeout (a library's watchdog) is no evidence": Case(
        LOCK, Seen.FROZEN, (ThreadWait(104, "S", Call.SLEEP, ends_in=0.1),)),
    # stopped
    "a stopped main thread is stopped, whatever it used before": Case(
        ThreadWait(100, "T"), Seen.STOPPED, cpu_share=1.0, stopped=True),
    # busy
    "CPU in the rank's own threads is busy": Case(
        ThreadWait(100, "R"), Seen.BUSY, cpu_share=0.9),
    "CPU in a child while the main thread waits for it is busy": Case(
        ThreadWait(100, "S", Call.CHILD, what="waits for child 200"), Seen.BUSY,
        cpu_share=0.6, children=(200,)),
    # waiting outside the job
    "waiting for a live child (subprocess.run of sleep) is outside": Case(
        ThreadWait(100, "S", Call.CHILD, what="waits for child 200 (sleep)"), Seen.OUTSIDE,
        children=(200,)),
    "polling a pipe from a child (subprocess.run capturing output) is outside": Case(
        ThreadWait(100, "S", Call.FDS, (Fd.CHILD, Fd.CHILD)), Seen.OUTSIDE, children=(200,)),
    "reading a socket to a server outside the job (urlopen) is outside": Case(
        ThreadWait(100, "S", Call.FDS, (Fd.OUTSIDE,), what="recvfrom"), Seen.OUTSIDE),
    "reading a file or a terminal is outside": Case(
        ThreadWait(100, "S", Call.FDS, (Fd.OUTSIDE,), what="read on /mnt/nfs/data"),
        Seen.OUTSIDE),
    "a main thread in disk wait is outside": Case(ThreadWait(100, "D"), Seen.OUTSIDE),
    "a child in disk wait is outside": Case(LOCK, Seen.OUTSIDE, children=(200,),
                                            disk_wait=(200,)),
    "a main thread waiting on a future while a helper downloads is outside": Case(
        LOCK, Seen.OUTSIDE, (GLOO_LOOP, ThreadWait(104, "S", Call.FDS, (Fd.OUTSIDE,)))),
    "a main thread waiting on a future while a helper waits for a child is outside": Case(
        LOCK, Seen.OUTSIDE, (ThreadWait(104, "S", Call.CHILD),), children=(200,)),
    "a main thread polling in short sleeps (a wait loop) is outside": Case(
        ThreadWait(100, "S", Call.SLEEP, ends_in=POLL_S / 2), Seen.OUTSIDE),
    "a main thread polling an event with a short timeout is outside": Case(
        ThreadWait(100, "S", Call.FUTEX, ends_in=POLL_S / 10), Seen.OUTSIDE),
    "a short timed wait whose switches did not move is no poll: frozen": Case(
        ThreadWait(100, "S", Call.SLEEP, ends_in=POLL_S / 2), Seen.FROZEN,
        switches_moved=False),
    "a main thread polling every 2 s under a 3 s hang timeout is outside": Case(
        ThreadWait(100, "S", Call.SLEEP, ends_in=1.9), Seen.OUTSIDE, poll_s=3.0),
    "a long sleep woken by a stack request is no poll, whatever the hang timeout": Case(
        ThreadWait(100, "S", Call.SLEEP, ends_in=590.0), Seen.FROZEN, poll_s=10.0),
    "a main thread blocked opening a FIFO no one writes yet is outside": Case(
        ThreadWait(100, "S", Call.FILE, what="openat of /tmp/fifo"), Seen.OUTSIDE),
    "a main thread waiting for a file lock is outside": Case(
        ThreadWait(100, "S", Call.FDS, (Fd.OUTSIDE,), what="flock on /tmp/lockf"), Seen.OUTSIDE),
    "waiting for a child that is stopped (SIGSTOP) is frozen": Case(
        ThreadWait(100, "S", Call.CHILD, what="waits for child 200 (python3)"), Seen.FROZEN,
        children=(200,), stopped_children=(200,)),
    "waiting for children of which one still runs is outside": Case(
        ThreadWait(100, "S", Call.CHILD, what="waits for child 200 (sh)"), Seen.OUTSIDE,
        children=(200, 201), stopped_children=(201,)),
    "a main thread whose wait could not be read is no evidence of a freeze": Case(
        ThreadWait(100, "S", Call.UNKNOWN), Seen.OUTSIDE),
    "a main thread in an event loop over a socket outside the job is outside": Case(
        ThreadWait(100, "S", Call.EPOLL, (Fd.JOB, Fd.OUTSIDE)), Seen.OUTSIDE),
}


def _samples(case: Case) -> tuple[TreeSample, TreeSample]:
    before_main = replace(case.main, switches=10)
    after_main = replace(case.main, switches=11 if case.switches_moved else 10)
    before = TreeSample(5.0, (before_main, *case.helpers), case.children)
    after = TreeSample(5.0 + case.cpu_share * INTERVAL, (after_main, *case.helpers),
                       case.children, case.disk_wait, case.stopped, case.stopped_children)
    return before, after


@pytest.mark.parametrize("name", list(CASES))
def test_a_quiet_rank_is_judged_from_its_process_tree(name: str) -> None:
    case = CASES[name]
    evidence = judge(*_samples(case), INTERVAL, case.poll_s)
    assert evidence.seen is case.seen, evidence
    assert evidence.why  # every judgement says why, for the straggler report
    assert evidence.progressing is (case.seen in (Seen.BUSY, Seen.OUTSIDE))


def test_the_reason_names_what_the_rank_waits_on() -> None:
    case = CASES["waiting for a live child (subprocess.run of sleep) is outside"]
    assert judge(*_samples(case), INTERVAL).why == "waits for child 200 (sleep)"
    busy = CASES["CPU in a child while the main thread waits for it is busy"]
    assert judge(*_samples(busy), INTERVAL).why == "60% of a core in its process tree"
