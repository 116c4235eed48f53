"""Is a rank's process making progress? Read from its ledger, else from /proc, without touching
the rank.

A heartbeat would keep beating while the main thread is wedged, so rankguard looks at the
process itself. The cheapest evidence is the rank's own ledger: entering an operation is
written by the rank's calling thread, so a rank whose ledger shows a new entry since the last
sample progressed, up to that entry's time (completions are not evidence: another thread
records them). For a rank whose ledger is quiet, /proc tells: its CPU time (all threads), and
the main thread's state and context switches. It progressed in a sample interval when it used
at least ``BUSY_SHARE`` of a core, or its main thread switched context (I/O, waits with
timeouts) or was running or in disk wait. A stopped (SIGSTOP), sleeping or deadlocked rank
shows none of these.

/proc is read only when it can matter: for a rank whose ledger is quiet, while some rank waits
in an operation (progress decides nothing else). A job whose ranks keep entering collectives
costs no /proc read at all; a rank that goes quiet while a peer waits is sampled from the
first tick on, and counted as progressing until the wait began, so a hang is still found one
hang timeout after the wait began.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from .. import proctree
from ..ledger import RankProgress

BUSY_SHARE = 0.05
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class _Sample:
    cpu: float
    switches: int
    state: str


def _read(pid: int) -> _Sample | None:
    fields = proctree.stat_fields(pid)
    if fields is None:
        return None
    try:
        with open(f"/proc/{pid}/task/{pid}/status") as f:
            status = f.read()
    except OSError:
        return None
    cpu = (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime, all threads
    switches = 0
    main_state = fields[0]
    for line in status.splitlines():
        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
            switches += int(line.split()[1])
        elif line.startswith("State:"):
            main_state = line.split()[1]
    return _Sample(cpu, switches, main_state)


def _last_entry(snap: RankProgress | None) -> float:
    """When the rank last entered an operation of any group (0.0: never)."""
    return max((g.t_enter for g in snap.groups if g.entered), default=0.0) if snap else 0.0


def _wait_began(snaps: Mapping[int, RankProgress]) -> float | None:
    """When the earliest operation some rank still waits in began; None when none waits."""
    began = [g.t_enter for snap in snaps.values() for g in snap.groups if g.waiting]
    return min(began) if began else None


class ProgressTracker:
    """Samples ranks' ledgers and processes, and remembers when each last made progress."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[float, _Sample]] = {}
        self._progress_at: dict[int, float] = {}
        self._pid: dict[int, int] = {}
        self._entry: dict[int, float] = {}  # the last entry seen in each rank's ledger
        self.proc_reads = 0  # /proc samples taken, for tests and benchmarks

    def start(self, rank: int, pid: int, now: float) -> None:
        """Track ``rank`` (process ``pid``), counting it as progressing at ``now``."""
        self._last.pop(rank, None)
        self._progress_at[rank] = now
        self._pid[rank] = pid
        self._entry.pop(rank, None)

    def forget(self, rank: int) -> None:
        self._pid.pop(rank, None)

    def sample(self, now: float, snaps: Mapping[int, RankProgress]) -> None:
        """Update each tracked rank's progress from ``snaps`` (its ledger read at ``now``),
        and from /proc where the ledger is quiet and some rank waits."""
        waiting_since = _wait_began(snaps)
        for rank, pid in self._pid.items():
            entry = _last_entry(snaps.get(rank))
            if entry > self._entry.get(rank, 0.0):
                self._entry[rank] = entry
                self._progress_at[rank] = max(self._progress_at[rank], entry)
                self._last.pop(rank, None)  # /proc history before that entry says nothing new
                continue
            if waiting_since is None:
                self._last.pop(rank, None)
                continue
            if rank not in self._last:  # not looked at since the wait began: it was not judged
                self._progress_at[rank] = max(self._progress_at[rank], waiting_since)
            self._sample_proc(rank, pid, now)

    def _sample_proc(self, rank: int, pid: int, now: float) -> None:
        current = _read(pid)
        self.proc_reads += 1
        if current is None:
            return
        previous = self._last.get(rank)
        self._last[rank] = (now, current)
        if previous is None:
            return
        t0, before = previous
        busy = current.cpu - before.cpu >= BUSY_SHARE * max(now - t0, 1e-3)
        active = current.state in ("R", "D") or current.switches != before.switches
        if current.state not in ("T", "t") and (busy or active):
            self._progress_at[rank] = now

    def idle_for(self, rank: int, now: float) -> float:
        """Seconds since ``rank`` last made progress."""
        return now - self._progress_at.get(rank, now)

    def stopped(self, rank: int) -> bool:
        """The rank's process is stopped (SIGSTOP or traced)."""
        last = self._last.get(rank)
        return last is not None and last[1].state in ("T", "t")
