"""Is a rank's process making progress? Read from its ledger, else from /proc, without touching
the rank.

A heartbeat would keep beating while the main thread is wedged, so rankguard looks at the
process itself. The cheapest evidence is the rank's own ledger: entering an operation is
written by the rank's calling thread, so a rank whose ledger shows a new entry since the last
sample progressed, up to that entry's time (completions are not evidence: another thread
records them). For a rank whose ledger is quiet, /proc tells (``proc_waits`` reads it; ``judge``
decides, a pure function of two samples):

- **stopped**: SIGSTOP, or a tracer.
- **busy** (a straggler): its process tree used at least ``BUSY_SHARE`` of a core since the last
  sample: the rank's threads, its children (a preprocessing tool, ``tar``) and the children they
  reaped.
- **waiting outside the job** (a straggler): a thread waits on a live child (``waitpid``, or a
  pipe or socket the child holds), on I/O to anything outside the job (a socket to another host
  or to a server that is not of the job, a file or a terminal), or in disk wait; or the main
  thread polls (short timed sleeps or lock waits, its context switches moving). A thread's wait
  counts when it is the main thread's, or when the main thread waits for another thread (a
  lock, a join, a future), except the loops of libraries: event loops (``epoll``), which wait
  on everything all the time, and timed polls of children's pipes (DataLoader's pin-memory
  thread).
- **frozen**: none of these. The main thread is blocked on something inside the job (a store
  key, a peer rank's socket), or on nothing at all (a lock or condition no one signals, a plain
  sleep, the GIL held by a thread that makes no progress), and no CPU is used anywhere in the
  tree. What cannot be read (no permission, an unknown call) is never taken as a freeze.

Context switches alone are no evidence: a stack request (SIGUSR1, ``rankguard stacks``) wakes a
blocked thread for a moment, and so would any probe of ours; a poll counts only when the main
thread's own wait is short.

/proc is read only when it can matter: for a rank whose ledger is quiet, while some rank waits
in an operation (progress decides nothing else). A job whose ranks keep entering collectives
costs no /proc read at all; a rank that goes quiet while a peer waits is sampled from the
first tick on, and counted as progressing until the wait began, so a hang is still found one
hang timeout after the wait began.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

from ..processes import proc_waits
from ..records.ledger import RankProgress
from ..margins import ASYNC_STALL_S
from ..processes.proc_waits import Call, Fd, JobPeers, ThreadWait, TreeSample

BUSY_SHARE = 0.05
# A timed wait of the main thread that ends within this many seconds is part of a poll.
POLL_S = 1.0


class Seen(enum.Enum):
    """What ``judge`` makes of a process between two samples."""

    STOPPED = "stopped"
    BUSY = "busy"
    OUTSIDE = "outside"  # waits on a child or on I/O outside the job, or polls
    FROZEN = "frozen"


@dataclass(frozen=True)
class Evidence:
    seen: Seen
    why: str  # for people: "busy: 40% of a core in its process tree", "waits for child 4717"

    @property
    def progressing(self) -> bool:
        return self.seen in (Seen.BUSY, Seen.OUTSIDE)


_STOPPED = Evidence(Seen.STOPPED, "stopped (SIGSTOP)")
_OUTSIDE_FDS = {Fd.CHILD, Fd.OUTSIDE, Fd.UNKNOWN}


def _waits_outside(thread: ThreadWait, main: bool) -> bool:
    """The thread waits on a child or on something outside the job (or what it waits on could
    not be read: no evidence of a freeze)."""
    if thread.state == "D" or thread.call in (Call.CHILD, Call.FILE, Call.UNKNOWN):
        return thread.call is not Call.UNKNOWN or main
    if thread.call is Call.FDS:
        if main:
            return bool(_OUTSIDE_FDS.intersection(thread.fds)) or not thread.fds
        # a helper's timed poll of its children's pipes is a library's loop (DataLoader's
        # pin-memory thread polls its workers every 5 s whether or not the rank waits on them)
        kinds = {Fd.OUTSIDE, Fd.UNKNOWN} | ({Fd.CHILD} if thread.ends_in is None else set())
        return bool(kinds.intersection(thread.fds))
    if thread.call is Call.EPOLL:  # a library's event loop, unless it is the main thread's
        return main and bool({Fd.CHILD, Fd.OUTSIDE}.intersection(thread.fds))
    return False


def judge(before: TreeSample, now: TreeSample, interval: float,
          poll_s: float = POLL_S) -> Evidence:
    """What the process did between two samples ``interval`` seconds apart (see the module
    doc). ``poll_s``: a timed wait of the main thread that ends within this many seconds is
    part of a poll (the launcher gives its hang timeout: a loop that wakes more often than
    that is a poll, a probe's wake-up of a long sleep is not). Pure: nothing is read here."""
    if now.stopped:
        return _STOPPED
    share = (now.cpu_s - before.cpu_s) / max(interval, 1e-3)
    if share >= BUSY_SHARE:
        return Evidence(Seen.BUSY, f"{share:.0%} of a core in its process tree")
    if now.disk_wait:
        return Evidence(Seen.OUTSIDE, f"child {now.disk_wait[0]} is in disk wait")
    main = now.main
    if (main.call is Call.CHILD and now.children
            and set(now.children) <= set(now.stopped_children)):
        return Evidence(Seen.FROZEN, f"{main.what}, which is stopped (SIGSTOP)")
    if _waits_outside(main, main=True):
        why = "in disk wait" if main.state == "D" else main.what
        return Evidence(Seen.OUTSIDE, why or "waits on what could not be read")
    earlier = next((t for t in before.threads if t.tid == main.tid), None)
    polls = (main.call in (Call.SLEEP, Call.FUTEX) and main.ends_in is not None
             and main.ends_in <= poll_s and earlier is not None
             and earlier.switches != main.switches)
    if polls:
        return Evidence(Seen.OUTSIDE, f"polls ({main.what}, the next wake in "
                                      f"{max(main.ends_in, 0.0):.2f} s)")
    if main.call is Call.FUTEX:  # it waits for another thread: what does that one wait for?
        helper = next((t for t in now.threads[1:] if _waits_outside(t, main=False)), None)
        if helper is not None:
            return Evidence(Seen.OUTSIDE, f"thread {helper.tid} {helper.what}".rstrip())
    return Evidence(Seen.FROZEN, _frozen_why(main))


def _frozen_why(main: ThreadWait) -> str:
    if main.call is Call.FUTEX:
        return "blocked on a lock or condition"
    if main.call is Call.SLEEP:
        return f"sleeping ({main.what})"
    if main.call in (Call.FDS, Call.EPOLL):
        return f"blocked in {main.what} inside the job"
    return f"no CPU, blocked in {main.what or 'the kernel'}"


def _last_entry(snap: RankProgress | None) -> float:
    """When the rank last entered an operation of any group (0.0: never)."""
    return max((g.t_enter for g in snap.groups if g.entered), default=0.0) if snap else 0.0


def _wait_began(snaps: Mapping[int, RankProgress], now: float) -> float | None:
    """When the earliest operation some rank still waits in began; None when none waits. An
    asynchronous group (NCCL) has operations pending all the time: it waits from its last
    completion, once that is ``ASYNC_STALL_S`` old."""
    began = [g.t_done if g.asynchronous else g.t_enter
             for snap in snaps.values() for g in snap.groups
             if g.waiting and (not g.asynchronous or now - g.t_done >= ASYNC_STALL_S)]
    return min(began) if began else None


class ProgressTracker:
    """Samples ranks' ledgers and processes, and remembers when each last made progress.

    ``peers``: the job's processes on this machine and its other hosts (what a descriptor
    leading inside the job is, see ``proc_waits.JobPeers``)."""

    def __init__(self, peers: JobPeers | None = None, poll_s: float = POLL_S) -> None:
        self.peers = peers or JobPeers()
        self.poll_s = poll_s  # see ``judge``
        self._last: dict[int, tuple[float, TreeSample]] = {}
        self._sockets: dict[int, dict[str, tuple[Fd, str]]] = {}  # placed, per rank
        self._seen: dict[int, Evidence] = {}
        self._progress_at: dict[int, float] = {}
        self._pid: dict[int, int] = {}
        self._entry: dict[int, float] = {}  # the last entry seen in each rank's ledger
        self.proc_reads = 0  # /proc samples taken, for tests and benchmarks

    def start(self, rank: int, pid: int, now: float) -> None:
        """Track ``rank`` (process ``pid``), counting it as progressing at ``now``."""
        self._last.pop(rank, None)
        self._seen.pop(rank, None)
        self._progress_at[rank] = now
        self._pid[rank] = pid
        self._entry.pop(rank, None)
        self._sockets[rank] = {}

    def forget(self, rank: int) -> None:
        self._pid.pop(rank, None)

    def sample(self, now: float, snaps: Mapping[int, RankProgress]) -> None:
        """Update each tracked rank's progress from ``snaps`` (its ledger read at ``now``),
        and from /proc where the ledger is quiet and some rank waits."""
        waiting_since = _wait_began(snaps, now)
        for rank, pid in self._pid.items():
            entry = _last_entry(snaps.get(rank))
            if entry > self._entry.get(rank, 0.0):
                self._entry[rank] = entry
                self._progress_at[rank] = max(self._progress_at[rank], entry)
                self._forget_proc(rank)  # /proc history before that entry says nothing new
                continue
            if waiting_since is None:
                self._forget_proc(rank)
                continue
            if rank not in self._last:  # not looked at since the wait began: it was not judged
                self._progress_at[rank] = max(self._progress_at[rank], waiting_since)
            self._sample_proc(rank, pid, now)

    def _forget_proc(self, rank: int) -> None:
        self._last.pop(rank, None)
        self._seen.pop(rank, None)

    def _sample_proc(self, rank: int, pid: int, now: float) -> None:
        current = proc_waits.sample(pid, self.peers, self._sockets[rank])
        self.proc_reads += 1
        if current is None:
            return
        previous = self._last.get(rank)
        self._last[rank] = (now, current)
        if previous is None:
            if current.stopped:
                self._seen[rank] = _STOPPED
            return
        t0, before = previous
        seen = judge(before, current, now - t0, self.poll_s)
        kept = self._seen.get(rank)
        if kept is None or seen.progressing or not kept.progressing:
            self._seen[rank] = seen  # a straggler is described by what it last did
        if seen.progressing:
            self._progress_at[rank] = now

    def idle_for(self, rank: int, now: float) -> float:
        """Seconds since ``rank`` last made progress."""
        return now - self._progress_at.get(rank, now)

    def stopped(self, rank: int) -> bool:
        """The rank's process is stopped (SIGSTOP or traced)."""
        last = self._last.get(rank)
        return last is not None and last[1].stopped

    def doing(self, rank: int) -> str:
        """What the rank's process was last seen doing that counted as progress (a poll's
        wake-up, not the sleeps between), else what it was seen doing; for people ("" if not
        sampled)."""
        seen = self._seen.get(rank)
        return seen.why if seen is not None else ""
