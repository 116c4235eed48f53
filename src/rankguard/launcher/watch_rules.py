"""What the attempt's loop does at each look: a pure function of what it observed.

The loop (``agent.Agent``) wakes on events (a rank's exit, output, a signal) and on its tick;
each time it gathers what it saw into a :class:`Look` and acts on the :class:`Decision` that
:func:`on_events` (every look) and :func:`on_tick` (once per tick, while the events decided
nothing) make of it: go on, or stop the attempt for a fault (its kind and cause in the
``Fault``; a signal to the launcher is one), with the lines to say and the stragglers to report
on the way. A fault the ranks show in their ledgers may have its cause on another node: the
decision then asks the node link first (``ASK_CAUSE``), and is made again with its answer.

Pure: reads nothing but its arguments (the tests are tables, ``tests/launcher/test_watch_rules``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Callable

from ..records import ledger as _ledger
from .. import margins
from ..processes import proctree
from .monitor import Verdict
from .outcome import (Fault, FaultKind, RankSnapshot, deadline_verdict, first_fault,
                      there_when_raised)


class Later(enum.Enum):
    """The node link's answer on a fault the ranks show: decide on a later look (the other
    nodes' beats may yet show its cause)."""

    LATER = "later"


LATER = Later.LATER


class Act(enum.Enum):
    """What the loop does after a look."""

    GO_ON = "go_on"  # watch on
    STOP = "stop"  # the attempt ends with ``Decision.fault``
    ASK_CAUSE = "ask_cause"  # ask the node link the cause of ``Decision.fault``, decide again


@dataclass(frozen=True)
class Straggler:
    """Report a straggler (journal and terminal); the attempt goes on waiting for it."""

    verdict: Verdict


@dataclass(frozen=True)
class Say:
    """A line for the terminal."""

    line: str


Report = Straggler | Say


@dataclass(frozen=True)
class Decision:
    """What to do after one look: ``reports`` first, in order, then ``act``."""

    act: Act
    fault: Fault | None = None  # STOP: the attempt's fault; ASK_CAUSE: the ranks' fault
    hang: Verdict | None = None  # STOP: the hang verdict the fault is, if it is one
    reports: tuple[Report, ...] = ()


@dataclass(frozen=True)
class Look:
    """What the attempt's loop observed at one look."""

    now: float  # monotonic
    ranks: tuple[RankSnapshot, ...]  # every rank of the attempt, its ledger as read at this look
    live: frozenset[int]  # the ranks still running
    exited: tuple[int, ...] = ()  # the ranks whose exit this look saw
    outside: Fault | None = None  # what ended the round elsewhere (the node link)
    signal: int | None = None  # the signal the launcher received, if any
    signal_at: float | None = None  # when it came (monotonic; None: at ``now``)
    # whether the node link leaves a verdict to another node (on one node: never)
    theirs: Callable[[Verdict], bool] = field(default=lambda verdict: False)
    # the node link's answer on the ranks' fault, once asked (None: not asked)
    cause: Fault | Later | None = None
    cascade_window: float = margins.CASCADE_WINDOW_S  # the node link's (see ``first_fault``)
    hang_timeout: float = 0.0
    in_place: bool = False  # the run recovers in place (``--recovery in-place``)


@dataclass(frozen=True)
class Tick:
    """What the loop gathers once per tick, after :func:`on_events` decided to go on."""

    overdue: Fault | None = None  # a replacement in place did not, or can no longer, join
    verdicts: tuple[Verdict, ...] = ()  # the hang rules' (``HangMonitor.check``)
    replacing: bool = False  # a replacement in place is awaited (``in_place``)
    stopped: Fault | None = None  # a rank stopped while a replacement joins (``in_place``)


def on_events(look: Look) -> Decision:
    """The decision of any look: what ended the round elsewhere, then the verdicts of the
    ranks that exited (their own collective deadline), the faults the ranks show once one
    exited, and a signal to the launcher."""
    if look.outside is not None:
        return Decision(Act.STOP, look.outside, look.outside.verdict, (
            Say(f"rankguard: {look.outside.describe()}; stopping this node's ranks"),))
    states = {state.rank: state for state in look.ranks}
    verdicts = [_own_deadline(look, states[rank]) for rank in look.exited]
    decided = _verdicts(look, [v for v in verdicts if v is not None], Decision(Act.GO_ON))
    if decided.act is not Act.STOP and look.exited:
        decided = _ledgers(look, decided.reports)
    if decided.act is Act.GO_ON and look.signal is not None:
        name = proctree.signal_name(look.signal)
        # dated from its arrival: the loop may see it late (the store's first hosting imports
        # torch on this thread, seconds under load), and the summary says how late
        at = look.now if look.signal_at is None else min(look.signal_at, look.now)
        fault = Fault(FaultKind.LAUNCHER_SIGNAL, at, None, f"the launcher received {name}")
        return Decision(Act.STOP, fault, None, decided.reports + (
            Say(f"rankguard: received {name}; stopping all ranks"),))
    return decided


def on_tick(look: Look, tick: Tick) -> Decision:
    """The decision of a tick's look (after :func:`on_events` decided to go on): a replacement
    in place overdue, a rank stopped while one joins, then a live rank's own collective
    deadline (once the cascade window has passed: a peer's death may explain it), the faults
    the ranks show, and the hang rules' verdicts (but while a replacement is awaited: its own
    deadline bounds the wait)."""
    if tick.overdue is not None:
        return Decision(Act.STOP, tick.overdue, tick.overdue.verdict, (
            Say(f"rankguard: {tick.overdue.describe()}; stopping the other ranks"),))
    if tick.stopped is not None:  # replaced in place with the one awaited, if it can be
        return Decision(Act.STOP, tick.stopped, None,
                        (Say(f"rankguard: hang: {tick.stopped.describe()}"),))
    raised = [_own_deadline(look, state) for state in look.ranks
              if state.rank in look.live and state.progress is not None
              and state.progress.fault == _ledger.FAULT_RAISED
              and look.now - state.progress.t_fault >= margins.CASCADE_WINDOW_S]
    decided = _verdicts(look, [v for v in raised if v is not None], Decision(Act.GO_ON))
    if decided.act is not Act.STOP:
        decided = _ledgers(look, decided.reports)
        if decided.act is Act.ASK_CAUSE:
            return decided
    if tick.replacing:
        return decided
    return _verdicts(look, list(tick.verdicts), decided)


def _verdicts(look: Look, verdicts: list[Verdict], decided: Decision) -> Decision:
    """Add ``verdicts`` to ``decided``, in order: a straggler is reported; the first hang stops
    the attempt (unless it is stopped already); another node's verdicts are left to it."""
    for verdict in verdicts:
        if look.theirs(verdict):
            continue
        if not verdict.hung:
            decided = replace(decided, reports=decided.reports + (Straggler(verdict),))
        elif decided.act is not Act.STOP:
            # the fault began when the peers started waiting, not when it was noticed
            fault = Fault(FaultKind.HUNG, look.now - verdict.waited_s, None,
                          "hang: " + verdict.describe(), verdict=verdict)
            decided = Decision(Act.STOP, fault, verdict, decided.reports + (
                Say(f"rankguard: hang: {verdict.describe()}"),))
    return decided


def _ledgers(look: Look, reports: tuple[Report, ...]) -> Decision:
    """The root cause among the faults the ranks show (a rank's exception or exit, acted on
    before its slow exit), once the node link has said whether its cause is elsewhere."""
    fault = first_fault(list(look.ranks), look.now, look.cascade_window, look.hang_timeout)
    if fault is None:
        return Decision(Act.GO_ON, reports=reports)
    if look.cause is None:
        return Decision(Act.ASK_CAUSE, fault, None, reports)
    if look.cause is LATER:
        return Decision(Act.GO_ON, reports=reports)
    stopping = "; stopping the other ranks" if look.live and not look.in_place else ""
    return Decision(Act.STOP, look.cause, None, reports + (
        Say(f"rankguard: {look.cause.describe()}{stopping}"),))


def _own_deadline(look: Look, state: RankSnapshot) -> Verdict | None:
    """The hang that the collective deadline ``state``'s rank raised reports, if any: only
    while the ranks it named are the processes it waited for (a rank replaced in place since
    is not; its ledger still names it, look after look)."""
    progress = _progress(state)
    return deadline_verdict(state.rank, progress,
                            there_when_raised(progress, look.ranks, look.live))


def _progress(state: RankSnapshot) -> _ledger.RankProgress:
    assert state.progress is not None, f"rank {state.rank}'s ledger was not read"
    return state.progress


def all_exited(ranks: tuple[RankSnapshot, ...], cascade_window: float,
               hang_timeout: float) -> Fault | None:
    """The fault the ranks show once every one has exited (nothing more will show: every
    cascade window has passed), for the node link to name its cause."""
    return first_fault(list(ranks), float("inf"), cascade_window, hang_timeout)
