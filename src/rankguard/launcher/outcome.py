"""How each rank ended, and which fault was the root cause.

Outcomes: ``ok`` (exit 0), ``raised`` (a Python exception escaped the script), ``usage_error``
(a ``rankguard.UsageError`` escaped it, or argparse refused its arguments: a mistake of the
script's, never repaired), ``exited``
(non-zero exit code, or code 0 while its peers still needed it), ``signalled`` (killed by a
signal it did not expect, or a SIGTERM that it answered with its own clean teardown, see
``runtime.eviction``), ``hung`` (blamed for a hang), ``victim`` (stopped, or failed inside a
collective, because of another rank's fault), ``teardown_timeout`` (did not exit within the
grace period and was SIGKILLed).

The root cause is the earliest fault in time that is not a victim (``first_fault``). A rank's
fault is timed from when it began: the time its exception reached the top, or its script
ended (both from its ledger, however long the interpreter's teardown takes afterwards), else
the time its exit was seen. A rank that left with code 0 is at fault only when a peer went on
to an operation the leaver never entered, on a group they share, and failed in it or waited
there ``--hang-timeout``: its peers can never complete it. One whose script ended with code 0
but whose process then exited with another code by itself is at fault when that exit is seen.

The run's exit code follows from the fault of its last attempt (``run_status``). Every decision
here is pure, a function of its arguments (ledger snapshots and process exits as ``RankSnapshot``
values, ``now``, the timeouts): table-tested in tests/launcher/test_outcome_rules.py.
"""

from __future__ import annotations

import enum
import math
import signal
from dataclasses import dataclass
from typing import Iterable, Mapping

from .. import blame
from ..records import ledger as _ledger
from ..processes.proctree import exit_detail, signal_name, teardown_detail
from ..supervisor import RankProcess
from .monitor import P2P, Verdict, group_label

OUTCOMES = ("ok", "raised", "usage_error", "exited", "signalled", "hung", "victim",
            "teardown_timeout")


class FaultKind(enum.StrEnum):
    """What went wrong first in an attempt (a :class:`Fault`'s kind); the journal and the
    round's end record carry its value."""

    RAISED = "raised"  # a rank's script raised
    # a rank's script raised a rankguard.UsageError (or argparse refused its arguments):
    # every process running it would again, so it is neither replaced nor restarted
    USAGE_ERROR = "usage_error"
    EXITED = "exited"  # a rank exited with an error code, or with 0 before its peers
    SIGNALLED = "signalled"  # a rank was killed by a signal
    HUNG = "hung"  # the hang rules blamed a rank
    LAUNCHER_SIGNAL = "launcher_signal"  # the launcher itself was told to stop
    # several nodes
    NODE_LEFT = "node_left"  # another node's agent was stopped
    NODE_LOST = "node_lost"  # another node went silent
    NODE_STOPPED = "node_stopped"  # this node's agent was stopped by the round
    STORE_LOST = "store_lost"  # the job's store is gone
    RENDEZVOUS = "rendezvous"  # no round could be formed
    STANDBY_END = "standby_end"  # the job ended while this node stood by
    REPLACE_FAILED = "replace_failed"  # --recovery in-place: a replacement did not join

# The launcher's exit codes (the README's table): see ``run_status``.
EXIT_OK = 0
EXIT_RANK_FAILED = 1
EXIT_USAGE = 2
EXIT_HUNG = 3
EXIT_INTERNAL = 4
_SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
# Faults after which no restart is tried: the launcher was told to stop; a rank's script made
# a mistake of its own (a usage error: a restart makes it again); with several nodes, the job's
# store is gone, a round could not be formed, or (a standby) the job is over.
FINAL_KINDS = frozenset({FaultKind.LAUNCHER_SIGNAL, FaultKind.USAGE_ERROR, FaultKind.STORE_LOST,
                         FaultKind.RENDEZVOUS, FaultKind.STANDBY_END, FaultKind.NODE_STOPPED})


# faults of another node as a whole, or of the store (several nodes)
_ELSEWHERE = frozenset({FaultKind.NODE_LOST, FaultKind.NODE_LEFT, FaultKind.NODE_STOPPED,
                        FaultKind.STORE_LOST})


@dataclass(frozen=True)
class Fault:
    """The first thing that went wrong in an attempt."""

    kind: FaultKind
    at: float  # monotonic
    rank: int | None = None
    detail: str = ""
    cascade: bool = False  # an error inside a collective: maybe a peer's fault's effect
    verdict: Verdict | None = None  # a hang: the verdict that blamed it (any node's)

    def describe(self) -> str:
        if self.rank is None:
            return self.detail
        return f"rank {self.rank} {self.detail}"


_NOTICES = {FaultKind.HUNG: _ledger.NOTICE_HUNG, FaultKind.NODE_LOST: _ledger.NOTICE_NODE_LOST,
            FaultKind.STORE_LOST: _ledger.NOTICE_STORE_LOST,
            FaultKind.NODE_LEFT: _ledger.NOTICE_NODE_LEFT}


def notice_kind(fault: Fault) -> int:
    """The notice that tells a surviving rank why it is stopped (``ledger.NOTICE_*``): that a
    rank hung, that a node or the job's store was lost, that another node's agent was
    stopped; for any other fault, that a rank died."""
    return _NOTICES.get(fault.kind, _ledger.NOTICE_DIED)


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
                "exit_code": self.exit_code, "signal": self.signal, "detail": self.detail}


@dataclass(frozen=True)
class RankSnapshot:
    """What the launcher knows of one rank at one moment: its ledger, and how its process
    ended once it has."""

    rank: int
    progress: _ledger.RankProgress | None
    returncode: int | None = None  # Popen's: negative for a signal
    exited_at: float | None = None  # monotonic, when the exit was seen
    pid: int = 0
    killed_by_launcher: bool = False  # needed SIGKILL after the grace period
    stopped: bool = False  # the launcher sent it SIGTERM or SIGKILL

    @classmethod
    def of(cls, member: RankProcess, progress: _ledger.RankProgress | None) -> "RankSnapshot":
        return cls(member.rank, progress, member.returncode, member.exited_at, member.pid,
                   member.killed, member.stopped)


def restarts_after(fault: Fault) -> bool:
    """Whether a restart may follow ``fault`` (while restarts remain): not after one of
    ``FINAL_KINDS``. Pure."""
    return fault.kind not in FINAL_KINDS


def raised_fault(rank: int, progress: _ledger.RankProgress) -> Fault:
    """The fault of a rank whose ledger says an exception reached the top of its script: a
    ``usage_error`` for a ``rankguard.UsageError`` (never a cascade: the script's own), else
    ``raised``."""
    if progress.error == _ledger.ErrorKind.USAGE:
        return usage_fault(rank, progress)
    where = " inside a collective" if progress.fault_in_collective else ""
    return Fault(FaultKind.RAISED, progress.t_fault, rank, f"raised an exception{where}",
                 bool(progress.fault_in_collective))


def usage_fault(rank: int, progress: _ledger.RankProgress) -> Fault:
    """The fault of a rank whose ledger says a usage error ended it (a ``rankguard.UsageError``,
    or argparse's refusal of its arguments): final, never a cascade."""
    return Fault(FaultKind.USAGE_ERROR, progress.t_fault, rank,
                 f"stopped on a usage error: {progress.error_text}; not restarted (fix the "
                 "script)")


def deadline_verdict(rank: int, progress: _ledger.RankProgress,
                     alive: set[int]) -> Verdict | None:
    """The hang a rank's own collective error reports: it raised ``rankguard.CollectiveError``
    naming ranks that never arrived, and they are all still running (a dead one is its own
    fault, seen from its exit; ``alive`` holds only the ranks whose process ran when it
    raised: one replaced since is not the one it named). None otherwise. A rank that raised
    before its first collective (a replacement whose join of a generation timed out) waited
    in ``init_process_group``, since its process took its rank."""
    if progress.fault != _ledger.FAULT_RAISED or not progress.blamed or not progress.groups:
        return None
    if not set(progress.blamed) <= alive:
        return None
    slot = _last_entered(progress)
    if slot.entered == 0:
        return Verdict(True, progress.blamed, (rank,), "init_process_group", slot.seq,
                       round(max(progress.t_fault - progress.t_start, 0.0), 3),
                       "collective_deadline", slot.key, group_label(slot))
    return Verdict(True, progress.blamed, (rank,), slot.kind, slot.seq,
                   round(max(progress.t_fault - slot.t_enter, 0.0), 3), "collective_deadline",
                   slot.key, group_label(slot))


def there_when_raised(progress: _ledger.RankProgress, ranks: Iterable[RankSnapshot],
                      live: Iterable[int]) -> set[int]:
    """Of the ``live`` ranks, those whose process had its rank when ``progress``'s fault was
    raised (a rank whose ledger its process has not taken yet, as the launcher made it, pid 0,
    is a new process: it was in no group). Pure."""
    started = {state.rank: state.progress.t_start for state in ranks
               if state.progress is not None and state.progress.pid != 0}
    return {rank for rank in live if started.get(rank, math.inf) <= progress.t_fault}


def _last_entered(progress: _ledger.RankProgress) -> _ledger.GroupProgress:
    return max(progress.groups, key=lambda g: g.t_enter)


def own_fault(state: RankSnapshot) -> Fault | None:
    """The fault a rank's own ledger or exit shows, whatever its peers did; None for none yet
    (a rank that left with code 0 is judged by ``early_exit``)."""
    progress, code = state.progress, state.returncode
    kind = progress.fault if progress is not None else _ledger.FAULT_NONE
    if kind == _ledger.FAULT_RAISED:
        assert progress is not None
        return raised_fault(state.rank, progress)
    if kind == _ledger.FAULT_EXITING:
        assert progress is not None
        if progress.exit_code == 0:
            late = _late_exit_code(state)
            if late is None:
                return None
            assert state.exited_at is not None
            return Fault(FaultKind.EXITED, state.exited_at, state.rank,
                         f"{exit_detail(late)} after its script ended with code 0")
        if progress.error == _ledger.ErrorKind.USAGE:
            return usage_fault(state.rank, progress)
        return Fault(FaultKind.EXITED, progress.t_fault, state.rank, exit_detail(progress.exit_code))
    if code is None:
        return None
    if kind == _ledger.FAULT_TERMINATED:
        assert progress is not None
        return Fault(FaultKind.SIGNALLED, progress.t_fault, state.rank, teardown_detail(code))
    if code == 0:
        return None
    assert state.exited_at is not None
    return Fault(FaultKind.SIGNALLED if code < 0 else FaultKind.EXITED, state.exited_at, state.rank,
                 exit_detail(code))


def _late_exit_code(state: RankSnapshot) -> int | None:
    """The non-zero code a rank's process exited with by itself after its script ended with
    code 0 (``os._exit(7)`` in a thread or an atexit handler: the job failed, as torchrun says
    too); None otherwise. A signal then is no fault (a daemon thread that comes back into the
    finalizing interpreter aborts it), nor is any end of a process the launcher stopped."""
    code = state.returncode
    if code is None or code <= 0 or state.stopped:
        return None
    return code


def departure(state: RankSnapshot) -> float | None:
    """When the rank left with exit code 0 (its script ended, or its process exited 0 without
    a word in its ledger, as ``os._exit(0)``); None if it has not."""
    progress = state.progress
    kind = progress.fault if progress is not None else _ledger.FAULT_NONE
    if kind == _ledger.FAULT_EXITING and progress is not None and progress.exit_code == 0:
        return progress.t_fault
    if kind == _ledger.FAULT_NONE and state.returncode == 0:
        return state.exited_at
    return None


def lingering(state: RankSnapshot, now: float, limit: float) -> float | None:
    """How long ago the script of a rank ended with code 0 while its process still lives, once
    that is at least ``limit`` seconds (``margins.linger_limit``); None otherwise. Pure."""
    left = departure(state)
    if state.returncode is not None or left is None or now - left < limit:
        return None
    return now - left


def early_exit(state: RankSnapshot, states: list[RankSnapshot], now: float,
               hang_timeout: float) -> Fault | None:
    """The fault of a rank that left with code 0 before an operation its peers went on to:
    some peer entered more operations of a group they share than the leaver did, and either
    failed inside its last one, or (alive) has waited in it ``hang_timeout`` since the departure
    (an asynchronous group: with no completion; see :func:`_stalled_since`), or (alive, in
    ``rankguard.StepLoop``) is still in its loop ``hang_timeout`` after the departure. The fault is
    timed from the departure, or from the peer's failure when that was seen first (the exit of
    a process is seen after the fact). Point-to-point operations are not counted on: ranks
    do different numbers of them. None when the departure harmed no one (yet)."""
    left = departure(state)
    if left is None or state.progress is None:
        return None
    mine = {g.key: g for g in state.progress.groups}
    for peer in states:
        progress = peer.progress
        if peer.rank == state.rank or progress is None:
            continue
        failed = progress.fault == _ledger.FAULT_RAISED and progress.fault_in_collective
        last = _last_entered(progress) if progress.groups else None
        for group in progress.groups:
            own = mine.get(group.key)
            if own is None or group.entered <= own.entered or group.kind in P2P:
                continue
            if failed and group is last:
                at = min(left, progress.t_fault)
            elif peer.returncode is None and group.waiting and \
                    now - max(_stalled_since(group), left) >= hang_timeout:
                at = left
            elif peer.returncode is None and progress.flags & _ledger.FLAG_STEP_LOOP and \
                    now - left >= hang_timeout:
                # rankguard.StepLoop caught the failed collective (so it is not waiting in it)
                # and waits in its regroup for a replacement nobody will start
                at = left
            else:
                continue
            # the first the leaver did not enter (an asynchronous peer may have enqueued more)
            where = _ledger.op_label(group.kind, group.seq_at(own.entered + 1),
                             group_label(group))
            return Fault(FaultKind.EXITED, at, state.rank,
                         f"exited with code 0 before {where} (rank {peer.rank} went on to it)")
    return None


def _stalled_since(group: _ledger.GroupProgress) -> float:
    """Since when a waiting group has made no progress: the entry into the operation it waits
    in; an asynchronous group's, its last completion (its CPU enqueued operations ahead, long
    before: a rank that leaves as the last completes may have published fewer of them, its
    sampler's tick being later than its exit)."""
    return group.t_done if group.asynchronous else group.t_enter


def remote_departure(departed: Mapping[int, tuple[_ledger.RankProgress, float]],
                     local: Mapping[int, _ledger.RankProgress], now: float,
                     hang_timeout: float) -> Fault | None:
    """:func:`early_exit` across nodes: the fault of another node's rank that left with code 0
    (``departed``: its progress as it left, and when, on this clock) before an operation a
    rank of this node (``local``: their ledgers) went on to; the earliest departure first.
    None when no departure explains this node's ranks. Pure."""
    peers = [RankSnapshot(rank, progress) for rank, progress in sorted(local.items())]
    for rank, (progress, left_at) in sorted(departed.items(), key=lambda item: item[1][1]):
        leaver = RankSnapshot(rank, progress, returncode=0, exited_at=left_at)
        fault = early_exit(leaver, peers, now, hang_timeout)
        if fault is not None:
            return fault
    return None


def is_cascade(progress: _ledger.RankProgress | None) -> bool:
    """The rank failed from inside a collective: what a peer's death does to it."""
    return progress is not None and progress.fault == _ledger.FAULT_RAISED and \
        progress.fault_in_collective


def first_fault(states: list[RankSnapshot], now: float, cascade_window: float,
                hang_timeout: float) -> Fault | None:
    """The root cause among the faults established at ``now`` (monotonic), or None.

    The rule is ``blame.root``'s, on each rank's fault timed by its ledger: a fault inside a
    collective (``is_cascade``) is a consequence, counted only ``cascade_window`` after it
    happened, and it yields to any own fault. Pure: reads nothing but its arguments.
    """
    failures = []
    for state in states:
        fault = own_fault(state) or early_exit(state, states, now, hang_timeout)
        if fault is not None:
            cascade = is_cascade(state.progress) and fault.kind == FaultKind.RAISED
            failures.append(blame.Failure(state.rank, fault.at, cascade, fault))
    first = blame.root(failures, now, cascade_window)
    return first.detail if first else None


def classify(states: list[RankSnapshot], root: Fault | None, hang: Verdict | None,
             teardown_at: float | None) -> list[RankOutcome]:
    """The outcome of every rank of a finished attempt, from each rank's last state.

    Blamed for the hang: ``hung``; the root cause: its kind; SIGKILLed after the grace:
    ``teardown_timeout``; exited once the teardown began (at ``teardown_at``), or failed
    inside a collective after the root cause (or at any time, when the root cause is on another
    node: it is timed when this node learned of it): ``victim``; otherwise its own fault's kind, or
    ``ok``. A rank whose script ended with code 0 before the teardown is ``ok``, though its
    process was still exiting when the teardown began (its ``departure``); one that failed
    by itself after the root cause (the launcher's notice to the survivors may be the cause)
    and exited once the teardown began is a ``victim``. A rank that was leaving with an exit
    code when it was stopped reports that code (its script's), whatever the teardown did.
    Pure: reads nothing but its arguments.
    """
    blamed = set(hang.blamed) if hang and hang.hung else set()
    # a root cause on another node (a node lost or gone, one of its ranks, the store) is timed
    # when this node learned of it, which may be after the failure it caused here
    local = {state.rank for state in states}
    remote = root is not None and (root.kind in _ELSEWHERE or (root.rank is not None
                                                               and root.rank not in local))
    results = []
    for state in states:
        code, progress = state.returncode, state.progress
        sig = signal_name(-code) if code is not None and code < 0 else None
        exit_code = code if code is not None and code >= 0 else None
        if progress is not None and progress.fault == _ledger.FAULT_EXITING:
            exit_code = progress.exit_code or _late_exit_code(state) or 0
        own = own_fault(state)
        if state.rank in blamed:
            outcome = "hung"
        elif root is not None and root.rank == state.rank:
            outcome = root.kind
        elif state.killed_by_launcher:
            outcome = "teardown_timeout"
        elif teardown_at is not None and _left_at(state) >= teardown_at:
            outcome = "victim"
        elif own is None:
            outcome = "ok"
        elif root is not None and (own.at >= root.at or remote) and is_cascade(progress):
            outcome = "victim"
        else:
            outcome = own.kind
        detail = exit_detail(code) if code is not None else "still running"
        if sig is not None and exit_code is not None:  # its script's code, then the signal
            detail = f"its script ended with code {exit_code}, then its process {detail} " \
                     "as it exited"
        results.append(RankOutcome(state.rank, state.pid, outcome, exit_code, sig, detail))
    return results


def _left_at(state: RankSnapshot) -> float:
    """When the rank left: its clean ``departure`` (the end of its script, from its ledger),
    else when its exit was seen; 0 while it runs."""
    left = departure(state)
    return left if left is not None else state.exited_at or 0.0


def run_status(fault: Fault | None, launcher_signal: int | None) -> tuple[str, int]:
    """How a run ended, from the fault of its last attempt: its status (``succeeded``, ``was
    interrupted``, ``failed``) and its exit code, as in the README's table. ``launcher_signal``:
    the signal the launcher received, if any (SIGINT 130, SIGTERM 143, another 128 + its
    number)."""
    if fault is None:
        return "succeeded", EXIT_OK
    if fault.kind == FaultKind.LAUNCHER_SIGNAL:
        assert launcher_signal is not None
        return "was interrupted", _SIGNAL_EXIT.get(launcher_signal, 128 + launcher_signal)
    return "failed", EXIT_HUNG if fault.kind == FaultKind.HUNG else EXIT_RANK_FAILED
