"""Hang and straggler detection: compare the ranks' ledgers, then look at the absent ranks.

For each process group, the ranks that have been waiting in an operation with no ledger event
for ``hang_timeout`` are candidates; the operation they wait in is the highest entry number
among them, and the candidates that entered it are the *waiters*. Members that have not entered
it are *absent*:

- an absent rank that made no progress (see ``progress``) for ``hang_timeout`` is **hung**;
- an absent rank that is busy (progressed in the last ``BUSY_RECENT_S``) is a **straggler**:
  reported once, and blamed as hung only when the waiters have waited ``straggler_timeout``;
- when every member entered the operation and it still does not complete ``hang_timeout``
  after the last one arrived, the stopped or idle members are blamed (all of them if none
  stands out).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ledger import GroupProgress, LedgerReader, RankProgress, seq_of
from .progress import ProgressTracker

# An absent rank counts as busy (a straggler) only if it made progress this recently; one that
# went quiet less than --hang-timeout ago is neither busy nor hung yet.
BUSY_RECENT_S = 0.5


@dataclass(frozen=True)
class Verdict:
    """A finding about one operation of one group: a straggler report or a hang."""

    hung: bool
    blamed: tuple[int, ...]
    waiting: tuple[int, ...]
    op: str
    seq: int
    waited_s: float
    # stopped | no_progress | straggler_timeout | busy | stuck_in_collective | collective_deadline
    reason: str
    group_key: int = 0

    @property
    def op_label(self) -> str:
        """``all_reduce #57``, or just ``init_process_group``."""
        return self.op if self.op == "init_process_group" else f"{self.op} #{self.seq}"

    def describe(self) -> str:
        blamed = _ranks(self.blamed)
        waiters = _ranks(self.waiting)
        if self.reason == "stuck_in_collective":
            return (f"{blamed} entered {self.op_label} but it never completed; "
                    f"{waiters} waited {self.waited_s:.1f} s")
        what = {"stopped": "stopped (SIGSTOP)", "no_progress": "made no progress",
                "busy": "busy", "straggler_timeout": "busy past --straggler-timeout",
                "collective_deadline": "named by a rank that gave up waiting for it"}
        return (f"{blamed} never reached {self.op_label} ({what[self.reason]}); "
                f"{waiters} waited {self.waited_s:.1f} s")


def _ranks(ranks: tuple[int, ...]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


@dataclass
class HangMonitor:
    """Reads every live rank's ledger on each ``check`` and returns new verdicts."""

    world_size: int
    hang_timeout: float
    straggler_timeout: float
    progress: ProgressTracker = field(default_factory=ProgressTracker)
    _readers: dict[int, LedgerReader] = field(default_factory=dict)
    _reported: set[tuple[int, int, int]] = field(default_factory=set)

    def watch(self, rank: int, pid: int, reader: LedgerReader, now: float) -> None:
        self._readers[rank] = reader
        self.progress.start(rank, pid, now)

    def unwatch(self, rank: int) -> None:
        self._readers.pop(rank, None)
        self.progress.forget(rank)

    def snapshot(self) -> dict[int, RankProgress]:
        return {rank: reader.read() for rank, reader in self._readers.items()}

    def check(self, now: float) -> list[Verdict]:
        """Sample progress, compare ledgers; stragglers are returned once, hangs every time."""
        self.progress.sample(now)
        snaps = self.snapshot()
        by_group: dict[int, dict[int, GroupProgress]] = {}
        for rank, snap in snaps.items():
            for group in snap.groups:
                by_group.setdefault(group.key, {})[rank] = group
        verdicts = []
        for key, entries in by_group.items():
            verdict = self._check_group(key, entries, now)
            if verdict is None:
                continue
            mark = (key, verdict.seq, verdict.blamed[0] if verdict.blamed else -1)
            if verdict.hung or mark not in self._reported:
                self._reported.add(mark)
                verdicts.append(verdict)
        return verdicts

    def _check_group(self, key: int, entries: dict[int, GroupProgress],
                     now: float) -> Verdict | None:
        waiters = [r for r, g in entries.items()
                   if g.waiting and now - g.last_event >= self.hang_timeout]
        if not waiters:
            return None
        target = max(entries[r].entered for r in waiters)
        # A rank behind the target is not waiting on the others (they got past its operation,
        # which it merely has not recorded as done, e.g. frozen before its next one).
        waiters = [r for r in waiters if entries[r].entered == target]
        sample = entries[waiters[0]]
        members = [r for r in sample.member_ranks(self.world_size) if r in self._readers]
        waited = max(now - entries[r].last_event for r in waiters)
        kind = entries[max(waiters, key=lambda r: entries[r].entered)].kind
        seq = seq_of(target, sample.is_world)
        absent = [r for r in members if r not in entries or entries[r].entered < target]

        def verdict(hung: bool, blamed: list[int], reason: str) -> Verdict:
            return Verdict(hung, tuple(sorted(blamed)), tuple(sorted(waiters)), kind, seq,
                           round(waited, 3), reason, key)

        if not absent:
            last_arrival = max(entries[r].t_enter for r in members if r in entries)
            if now - last_arrival < self.hang_timeout:
                return None  # the last rank arrived only now: give the operation time to end
            stopped = [r for r in members if self.progress.stopped(r)]
            if stopped:
                return verdict(True, stopped, "stopped")
            idle = [r for r in members
                    if self.progress.idle_for(r, now) >= self.hang_timeout and r not in waiters]
            return verdict(True, idle or members, "stuck_in_collective")
        stopped = [r for r in absent if self.progress.stopped(r)]
        if stopped:
            return verdict(True, stopped, "stopped")
        frozen = [r for r in absent if self.progress.idle_for(r, now) >= self.hang_timeout]
        if frozen:
            return verdict(True, frozen, "no_progress")
        if waited >= self.straggler_timeout:
            return verdict(True, absent, "straggler_timeout")
        busy = [r for r in absent if self.progress.idle_for(r, now) <= BUSY_RECENT_S]
        if busy:
            return verdict(False, busy, "busy")
        return None  # went quiet only lately: frozen or not, the next checks will tell
