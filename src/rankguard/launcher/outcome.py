"""How each rank ended, and which fault was the root cause.

Outcomes: ``ok`` (exit 0), ``raised`` (a Python exception escaped the script), ``exited``
(non-zero exit code), ``signalled`` (killed by a signal it did not expect, or a SIGTERM that it
answered with its own clean teardown, see ``runtime.eviction``), ``hung`` (blamed for
a hang), ``victim`` (stopped, or failed inside a collective, because of another rank's fault),
``teardown_timeout`` (did not exit within the grace period and was SIGKILLed).

The root cause is the earliest fault in time that is not a victim: a rank that raised (the time
its exception reached the top, from its ledger), exited or was killed (the time its exit was
seen), or was blamed for a hang, or a signal to the launcher.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ledger as _ledger
from ..proctree import exit_detail, signal_name
from .group import Rank
from .monitor import Verdict

OUTCOMES = ("ok", "raised", "exited", "signalled", "hung", "victim", "teardown_timeout")


@dataclass(frozen=True)
class Fault:
    """The first thing that went wrong in an attempt."""

    kind: str  # raised | exited | signalled | hung | launcher_signal
    at: float  # monotonic
    rank: int | None = None
    detail: str = ""

    def describe(self) -> str:
        if self.rank is None:
            return self.detail
        return f"rank {self.rank} {self.detail}"


@dataclass(frozen=True)
class RankOutcome:
    rank: int
    pid: int
    outcome: str
    exit_code: int | None
    signal: str | None
    detail: str

    def as_dict(self) -> dict[str, object]:
        return {"rank": self.rank, "pid": self.pid, "outcome": self.outcome,
                "exit_code": self.exit_code, "signal": self.signal}


def raised_fault(rank: int, progress: _ledger.RankProgress) -> Fault:
    """The fault of a rank whose ledger says an exception reached the top of its script."""
    where = " inside a collective" if progress.fault_in_collective else ""
    return Fault("raised", progress.t_fault, rank, f"raised an exception{where}")


def deadline_verdict(rank: int, progress: _ledger.RankProgress,
                     alive: set[int]) -> Verdict | None:
    """The hang a rank's own collective error reports: it raised ``rankguard.CollectiveError``
    naming ranks that never arrived, and they are all still running (a dead one is its own
    fault, seen from its exit). None otherwise."""
    if progress.fault != _ledger.FAULT_RAISED or not progress.blamed or not progress.groups:
        return None
    if not set(progress.blamed) <= alive:
        return None
    slot = max(progress.groups, key=lambda g: g.t_enter)
    seq = _ledger.seq_of(slot.entered, slot.is_world)
    return Verdict(True, progress.blamed, (rank,), slot.kind, seq,
                   round(max(progress.t_fault - slot.t_enter, 0.0), 3), "collective_deadline",
                   slot.key)


def fault_of(member: Rank, progress: _ledger.RankProgress | None) -> Fault | None:
    """The fault a rank's own exit represents, or None for a clean exit."""
    code = member.returncode
    if code is None:
        return None
    if progress is not None and progress.fault == _ledger.FAULT_TERMINATED:
        return Fault("signalled", progress.t_fault, member.rank,
                     f"got SIGTERM (tore itself down, {exit_detail(code)})")
    if code == 0:
        return None
    assert member.exited_at is not None
    if progress is not None and progress.fault == _ledger.FAULT_RAISED:
        return raised_fault(member.rank, progress)
    kind = "signalled" if code < 0 else "exited"
    return Fault(kind, member.exited_at, member.rank, exit_detail(code))


def is_cascade(progress: _ledger.RankProgress | None) -> bool:
    """The rank failed from inside a collective: what a peer's death does to it."""
    return progress is not None and progress.fault == _ledger.FAULT_RAISED and \
        progress.fault_in_collective


def classify(ranks: list[Rank], last: dict[int, _ledger.RankProgress], root: Fault | None,
             hang: Verdict | None, teardown_at: float | None) -> list[RankOutcome]:
    """The outcome of every rank of a finished attempt."""
    blamed = set(hang.blamed) if hang and hang.hung else set()
    results = []
    for member in ranks:
        code = member.returncode
        sig = signal_name(-code) if code is not None and code < 0 else None
        exit_code = code if code is not None and code >= 0 else None
        progress = last.get(member.rank)
        own = fault_of(member, progress)
        if member.rank in blamed:
            outcome = "hung"
        elif root is not None and root.rank == member.rank:
            outcome = root.kind
        elif member.killed_by_launcher:
            outcome = "teardown_timeout"
        elif teardown_at is not None and (member.exited_at or 0) >= teardown_at:
            outcome = "victim"
        elif own is None:
            outcome = "ok"
        elif root is not None and own.at >= root.at and is_cascade(progress):
            outcome = "victim"
        else:
            outcome = own.kind
        detail = exit_detail(code) if code is not None else "still running"
        results.append(RankOutcome(member.rank, member.pid, outcome, exit_code, sig, detail))
    return results
