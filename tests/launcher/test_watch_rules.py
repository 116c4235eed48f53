"""The attempt loop's decision at each look (``launcher.watch_rules``), as tables over fake
ledger snapshots: what stops an attempt, in which order, what is only reported, and when the
node link is asked for a fault's cause."""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass

import pytest

from rankguard.records import ledger as L
from rankguard.launcher.monitor import Verdict
from rankguard.launcher.outcome import Fault, FaultKind, RankSnapshot
from rankguard.launcher.watch_rules import (LATER, Act, Decision, Look, Say, Tick,
                                            all_exited, on_events, on_tick)
from rankguard.margins import CASCADE_WINDOW_S
from tests.launcher.snapshots import ledger, raised_in, world

RUNNING = RankSnapshot(1, ledger(world(6, 5, t_enter=4.0)))
DIED = RankSnapshot(1, ledger(world(5)), 4, 1.2)  # exited with code 4 at 1.2
LOST = Fault(FaultKind.NODE_LOST, 1.0, None, "node 1 was silent for 10 s")
CAUSE = Fault(FaultKind.EXITED, 1.2, 1, "exited with code 4")


def deadline_raised(t_fault: float = 5.0) -> RankSnapshot:
    """Rank 0 raised CollectiveTimeout at ``t_fault`` naming rank 1, one second after it
    entered all_reduce #6."""
    return RankSnapshot(0, ledger(world(6, t_enter=t_fault - 1.0), fault=L.FAULT_RAISED,
                               in_collective=True, t_fault=t_fault, blamed=(1,)))


def verdict(hung: bool, blamed: int) -> Verdict:
    return Verdict(hung, (blamed,), (0,), "all_reduce", 6, 2.0,
                   "no_progress" if hung else "busy", L.group_key("world"))


def look(*ranks: RankSnapshot, now: float = 6.0, live: tuple[int, ...] = (0, 1),
         **fields: object) -> Look:
    return dataclasses.replace(Look(now, ranks, frozenset(live)), **fields)


def seen(decision: Decision) -> tuple[object, ...]:
    """A decision as a row can spell it: what it does, its fault's kind and rank, and its
    reports (a line's start, or the ranks a straggler blames)."""
    fault = decision.fault
    reports = tuple(("say", r.line.split(":")[1].strip()) if isinstance(r, Say)
                    else ("straggler", r.verdict.blamed) for r in decision.reports)
    return (decision.act, fault.kind if fault else None, fault.rank if fault else None,
            reports)


@dataclass(frozen=True)
class Row:
    look: Look
    want: tuple[object, ...]
    tick: Tick | None = None  # None: on_events


EVENTS = {
    "a fault that ended the round elsewhere stops this node's ranks before anything else":
        Row(look(deadline_raised(), DIED, exited=(1,), outside=LOST, signal=signal.SIGTERM),
            (Act.STOP, FaultKind.NODE_LOST, None, (("say", "node 1 was silent for 10 s; "
                                                    "stopping this node's ranks"),))),
    "a rank that exited after its collective deadline named a live peer: that peer hangs":
        Row(look(deadline_raised(), RUNNING, exited=(0,), live=(1,)),
            (Act.STOP, FaultKind.HUNG, None, (("say", "hang"),))),
    "a collective deadline naming a rank that died too is no hang: its death is asked about":
        Row(look(deadline_raised(), DIED, exited=(0, 1), live=()),
            (Act.ASK_CAUSE, FaultKind.EXITED, 1, ())),
    "a deadline verdict another node's agent makes is left to it; the exit is asked about":
        Row(look(deadline_raised(), RUNNING, exited=(0,), live=(1,),
                 theirs=lambda v: True), (Act.ASK_CAUSE, FaultKind.RAISED, 0, ())),
    "a rank's exit asks the node link for the cause of the fault the ranks show":
        Row(look(RUNNING, DIED, exited=(1,), live=(0,)),
            (Act.ASK_CAUSE, FaultKind.EXITED, 1, ())),
    "the node link's cause stops the attempt, saying the other ranks are stopped":
        Row(look(RUNNING, DIED, exited=(1,), live=(0,), cause=CAUSE),
            (Act.STOP, FaultKind.EXITED, 1, (("say", "rank 1 exited with code 4; stopping "
                                              "the other ranks"),))),
    "the node link may name another cause than the ranks show":
        Row(look(RUNNING, DIED, exited=(1,), live=(0,), cause=LOST),
            (Act.STOP, FaultKind.NODE_LOST, None, (("say", "node 1 was silent for 10 s; "
                                                    "stopping the other ranks"),))),
    "with recovery in place the line does not say the other ranks are stopped":
        Row(look(RUNNING, DIED, exited=(1,), live=(0,), cause=CAUSE, in_place=True),
            (Act.STOP, FaultKind.EXITED, 1, (("say", "rank 1 exited with code 4"),))),
    "once no rank is left, the line says nothing of stopping others":
        Row(look(DIED, exited=(1,), live=(), cause=CAUSE),
            (Act.STOP, FaultKind.EXITED, 1, (("say", "rank 1 exited with code 4"),))),
    "the node link's 'later' goes on watching":
        Row(look(RUNNING, DIED, exited=(1,), live=(0,), cause=LATER),
            (Act.GO_ON, None, None, ())),
    "a signal stops all ranks while the node link says 'later'":
        Row(look(RUNNING, DIED, exited=(1,), live=(0,), cause=LATER, signal=signal.SIGTERM),
            (Act.STOP, FaultKind.LAUNCHER_SIGNAL, None,
             (("say", "received SIGTERM; stopping all ranks"),))),
    "a signal stops all ranks when nothing else shows":
        Row(look(RUNNING, signal=signal.SIGINT),
            (Act.STOP, FaultKind.LAUNCHER_SIGNAL, None,
             (("say", "received SIGINT; stopping all ranks"),))),
    "a look that saw no exit leaves the ranks' faults to the tick":
        Row(look(RUNNING, DIED, live=(0,)), (Act.GO_ON, None, None, ())),
}

PAST_WINDOW = 5.0 + CASCADE_WINDOW_S + 0.01  # deadline_raised's, and its cascade window
STRAGGLER, HANG, HANG2 = verdict(False, 1), verdict(True, 1), verdict(True, 0)

TICKS = {
    "a replacement in place that is overdue stops the other ranks":
        Row(look(RUNNING, in_place=True), (Act.STOP, FaultKind.REPLACE_FAILED, 1, (
            ("say", "rank 1 was not replaced in time; stopping the other ranks"),)),
            Tick(Fault(FaultKind.REPLACE_FAILED, 5.0, 1, "was not replaced in time"), (HANG,),
                 replacing=True)),
    "a live rank's collective deadline counts once the cascade window has passed":
        Row(look(deadline_raised(), RUNNING, now=PAST_WINDOW),
            (Act.STOP, FaultKind.HUNG, None, (("say", "hang"),)), Tick()),
    "a live rank's collective deadline naming a rank replaced since is no hang (its ledger "
    "names it look after look): the rank that raised is asked about":
        Row(look(deadline_raised(), RankSnapshot(1, ledger(world(0), t_start=5.5)),
                 now=PAST_WINDOW), (Act.ASK_CAUSE, FaultKind.RAISED, 0, ()), Tick()),
    "nor one naming a rank whose new process has no ledger yet":
        Row(look(deadline_raised(), RankSnapshot(1, None), now=PAST_WINDOW),
            (Act.ASK_CAUSE, FaultKind.RAISED, 0, ()), Tick()),
    "nor one naming a rank whose new process has not taken the ledger the launcher made":
        Row(look(deadline_raised(), RankSnapshot(1, dataclasses.replace(ledger(world(0)), pid=0)),
                 now=PAST_WINDOW), (Act.ASK_CAUSE, FaultKind.RAISED, 0, ()), Tick()),
    "a live rank's collective deadline waits out the cascade window":
        Row(look(deadline_raised(), RUNNING, now=5.0 + CASCADE_WINDOW_S / 2),
            (Act.GO_ON, None, None, ()), Tick()),
    "a straggler is reported and the attempt goes on":
        Row(look(RUNNING), (Act.GO_ON, None, None, (("straggler", (1,)),)),
            Tick(verdicts=(STRAGGLER,))),
    "the first hang stops the attempt; the stragglers around it are reported in order":
        Row(look(RUNNING), (Act.STOP, FaultKind.HUNG, None, (
            ("straggler", (1,)), ("say", "hang"), ("straggler", (1,)))),
            Tick(verdicts=(STRAGGLER, HANG, HANG2, STRAGGLER))),
    "a rank stopped while a replacement in place is awaited stops the attempt, naming it, "
    "to be replaced too (the hang rules wait for the replacement)":
        Row(look(RUNNING, in_place=True), (Act.STOP, FaultKind.HUNG, 2, (
            ("say", "hang"),)),
            Tick(verdicts=(HANG,), replacing=True, stopped=Fault(
                FaultKind.HUNG, 5.0, 2, "was stopped (SIGSTOP) for 3.0 s"))),
    "a hang found while a replacement in place is awaited waits for it":
        Row(look(RUNNING, in_place=True), (Act.GO_ON, None, None, ()),
            Tick(verdicts=(HANG,), replacing=True)),
    "a hang another node's agent names is left to it":
        Row(look(RUNNING, theirs=lambda v: True), (Act.GO_ON, None, None, ()),
            Tick(verdicts=(HANG,))),
    "a live rank's deadline stops the attempt before the hang rules' stragglers are reported":
        Row(look(deadline_raised(), RUNNING, now=PAST_WINDOW),
            (Act.STOP, FaultKind.HUNG, None, (("say", "hang"), ("straggler", (1,)))),
            Tick(verdicts=(STRAGGLER,))),
    "the faults the ranks show are asked about on a tick too":
        Row(look(RUNNING, DIED, live=(0,)), (Act.ASK_CAUSE, FaultKind.EXITED, 1, ()),
            Tick(verdicts=(HANG,))),
    "the faults the ranks show stop the attempt before the hang rules' hang":
        Row(look(RUNNING, DIED, live=(0,), cause=CAUSE),
            (Act.STOP, FaultKind.EXITED, 1, (("say", "rank 1 exited with code 4; stopping "
                                              "the other ranks"),)), Tick(verdicts=(HANG,))),
    "after the node link's 'later', the hang rules' hang stops the attempt":
        Row(look(RUNNING, DIED, live=(0,), cause=LATER),
            (Act.STOP, FaultKind.HUNG, None, (("say", "hang"),)), Tick(verdicts=(HANG,))),
}


@pytest.mark.parametrize("row", EVENTS.values(), ids=EVENTS.keys())
def test_on_events(row: Row) -> None:
    assert seen(on_events(row.look)) == row.want


@pytest.mark.parametrize("row", TICKS.values(), ids=TICKS.keys())
def test_on_tick(row: Row) -> None:
    assert row.tick is not None
    assert seen(on_tick(row.look, row.tick)) == row.want


def test_a_signal_dates_from_its_arrival_not_from_the_look_that_saw_it() -> None:
    # the loop sees a signal late while the store's first hosting imports torch on its thread
    late = on_events(look(RUNNING, now=6.0, signal=signal.SIGINT, signal_at=2.5))
    at_once = on_events(look(RUNNING, now=6.0, signal=signal.SIGINT))
    assert late.fault is not None and late.fault.at == 2.5
    assert at_once.fault is not None and at_once.fault.at == 6.0


def test_a_hang_began_when_its_peers_started_waiting() -> None:
    decision = on_tick(look(RUNNING, now=10.0), Tick(verdicts=(HANG,)))
    assert decision.fault is not None and decision.hang is HANG
    assert decision.fault.at == 10.0 - HANG.waited_s


def test_once_every_rank_exited_a_failure_in_a_collective_is_the_root_at_once() -> None:
    ranks = (RankSnapshot(0, raised_in(12, 1.0), 1, 1.0),
             RankSnapshot(1, ledger(world(12)), 0, 1.1))
    fault = all_exited(ranks, CASCADE_WINDOW_S, 10.0)
    assert fault is not None and (fault.kind, fault.rank) == (FaultKind.RAISED, 0)


def test_once_every_rank_exited_cleanly_there_is_no_fault() -> None:
    ranks = (RankSnapshot(0, ledger(world(12)), 0, 1.0), RankSnapshot(1, ledger(world(12)), 0, 1.1))
    assert all_exited(ranks, CASCADE_WINDOW_S, 10.0) is None
