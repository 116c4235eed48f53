"""Is a rank's process making progress? Read from /proc, without touching the rank.

A heartbeat would keep beating while the main thread is wedged, so rankguard looks at the
process itself: its CPU time (all threads), and the main thread's state and context switches.
A rank is progressing in a sample interval when it used at least ``BUSY_SHARE`` of a core, or its
main thread switched context (I/O, waits with timeouts) or was running or in disk wait. A
stopped (SIGSTOP), sleeping or deadlocked rank shows none of these.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

BUSY_SHARE = 0.05
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class _Sample:
    cpu: float
    switches: int
    state: str


def _read(pid: int) -> _Sample | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/task/{pid}/status") as f:
            status = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime, all threads
    switches = 0
    main_state = fields[0]
    for line in status.splitlines():
        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
            switches += int(line.split()[1])
        elif line.startswith("State:"):
            main_state = line.split()[1]
    return _Sample(cpu, switches, main_state)


class ProgressTracker:
    """Samples ranks' processes and remembers when each last made progress."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[float, _Sample]] = {}
        self._progress_at: dict[int, float] = {}
        self._pid: dict[int, int] = {}

    def start(self, rank: int, pid: int, now: float) -> None:
        """Track ``rank`` (process ``pid``), counting it as progressing at ``now``."""
        self._last.pop(rank, None)
        self._progress_at[rank] = now
        self._pid[rank] = pid

    def forget(self, rank: int) -> None:
        self._pid.pop(rank, None)

    def sample(self, now: float) -> None:
        for rank, pid in self._pid.items():
            current = _read(pid)
            if current is None:
                continue
            previous = self._last.get(rank)
            self._last[rank] = (now, current)
            if previous is None:
                continue
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
