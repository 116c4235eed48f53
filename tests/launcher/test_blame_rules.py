"""Who is the root cause, who is hung, and how a mismatch is named: the launcher's decisions,
table-driven over fake ledger snapshots (milliseconds each; the end-to-end runs that prove
the same on real ranks are in test_faults.py and test_early_exit.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rankguard import ledger as L
from rankguard.launcher.monitor import HangMonitor, mismatched
from rankguard.launcher.outcome import RankState, first_fault

WINDOW, HANG = 0.3, 3.0
WORLD = L.group_key("world")
SUB = L.group_key("1")


def world(entered: int, done: int | None = None, kind: str = "all_reduce",
          t_enter: float = 0.0, members: int = 0b11) -> L.GroupProgress:
    done = entered if done is None else done
    return L.GroupProgress(WORLD, members, True, bin(members).count("1"), entered, done, kind,
                           t_enter, t_enter if done == entered else 0.0)


def sub(entered: int, done: int | None = None, kind: str = "barrier", t_enter: float = 0.0,
        members: int = 0b110) -> L.GroupProgress:
    done = entered if done is None else done
    return L.GroupProgress(SUB, members, False, bin(members).count("1"), entered, done, kind,
                           t_enter, t_enter if done == entered else 0.0)


def ledger(*groups: L.GroupProgress, fault: int = L.FAULT_NONE, in_collective: bool = False,
           t_fault: float = 0.0, exit_code: int = 0) -> L.RankProgress:
    return L.RankProgress(1, 0, fault, in_collective, t_fault, 0.0, groups, (), exit_code)


def raised_in(entered: int, t_fault: float) -> L.RankProgress:
    """A rank whose collective failed (gloo marks it done) and whose exception reached the top."""
    return ledger(world(entered, t_enter=t_fault - 0.1), fault=L.FAULT_RAISED,
                  in_collective=True, t_fault=t_fault)


def leaving(entered: int, t_fault: float, code: int) -> L.RankProgress:
    return ledger(world(entered), fault=L.FAULT_EXITING, t_fault=t_fault, exit_code=code)


@dataclass
class Case:
    states: list[RankState]
    now: float
    root: tuple[int | None, str, float] | None  # (rank, describe(), at) or None
    hint: str = ""


CASES = {
    # sys.exit(3) in rank 1, whose interpreter is still tearing down; rank 0 failed in #11
    "nonzero exit is the root while its process lives on": Case(
        [RankState(0, raised_in(12, 1.2)), RankState(1, leaving(11, 1.0, 3))], 1.25,
        (1, "rank 1 exited with code 3", 1.0)),
    "nonzero exit counts even before the peer fails": Case(
        [RankState(0, ledger(world(12, 11, t_enter=0.9))), RankState(1, leaving(11, 1.0, 3))],
        1.01, (1, "rank 1 exited with code 3", 1.0)),
    "sys.exit(0) before the peers' collective is the root": Case(
        [RankState(0, raised_in(12, 1.2)), RankState(1, leaving(11, 1.0, 0))], 1.21,
        (1, "rank 1 exited with code 0 before all_reduce #11 (rank 0 went on to it)", 1.0)),
    # os._exit(0): nothing in the ledger; the exit is seen after the peer already failed
    "os._exit(0) seen late is timed by the failure it caused": Case(
        [RankState(0, raised_in(12, 1.2)), RankState(1, ledger(world(11)), 0, 1.25)], 1.3,
        (1, "rank 1 exited with code 0 before all_reduce #11 (rank 0 went on to it)", 1.2)),
    "the peer waits --hang-timeout for a rank that left with 0": Case(
        [RankState(0, ledger(world(12, 11, t_enter=1.0))), RankState(1, leaving(11, 0.9, 0))],
        1.0 + HANG, (1, "rank 1 exited with code 0 before all_reduce #11 (rank 0 went on to it)",
                     0.9)),
    "a peer waiting less than --hang-timeout proves nothing yet": Case(
        [RankState(0, ledger(world(12, 11, t_enter=1.0))), RankState(1, leaving(11, 0.9, 0))],
        1.0 + HANG - 0.1, None),
    "ranks that finished the same work are no fault": Case(
        [RankState(0, leaving(12, 1.0, 0), 0, 1.5), RankState(1, leaving(12, 1.1, 0), 0, 1.6)],
        2.0, None),
    "point-to-point counts differ between ranks: no evidence": Case(
        [RankState(0, ledger(world(12, 11, kind="recv", t_enter=1.0))),
         RankState(1, leaving(11, 0.9, 0))], 10.0, None),
    "a failure in a collective waits for its cause to show": Case(
        [RankState(0, raised_in(12, 1.0)), RankState(1, ledger(world(12, 11)))], 1.0 + 0.1,
        None),
    "a failure in a collective with no other cause is the root after the window": Case(
        [RankState(0, raised_in(12, 1.0)), RankState(1, ledger(world(12, 11)))],
        1.0 + WINDOW, (0, "rank 0 raised an exception inside a collective", 1.0)),
    "a peer that left as much as the failed rank is no cause": Case(
        [RankState(0, raised_in(12, 1.0)), RankState(1, leaving(12, 0.5, 0), 0, 0.6)],
        1.0 + WINDOW, (0, "rank 0 raised an exception inside a collective", 1.0)),
    # SIGKILL: the peer's gloo error is recorded before the launcher reaps the killed rank
    "a death beats the failure it caused, whatever the clock says": Case(
        [RankState(0, raised_in(12, 1.02)), RankState(1, ledger(world(11)), -9, 1.05)],
        1.05, (1, "rank 1 was killed by SIGKILL", 1.05)),
    "a death beats the failure it caused, even when both are seen late": Case(
        [RankState(0, raised_in(12, 1.02)), RankState(1, ledger(world(11)), -9, 1.05)],
        1.05 + WINDOW, (1, "rank 1 was killed by SIGKILL", 1.05)),
    "an exception outside a collective is the root at once": Case(
        [RankState(0, ledger(world(5), fault=L.FAULT_RAISED, t_fault=1.0)),
         RankState(1, ledger(world(6, 5)))], 1.0, (0, "rank 0 raised an exception", 1.0)),
    "a SIGTERM teardown counts when its exit is seen": Case(
        [RankState(0, ledger(world(5), fault=L.FAULT_TERMINATED, t_fault=1.0)),
         RankState(1, ledger(world(6, 5)))], 2.0, None),
    "a SIGTERM teardown that exited": Case(
        [RankState(0, ledger(world(5), fault=L.FAULT_TERMINATED, t_fault=1.0), 0, 1.1),
         RankState(1, ledger(world(6, 5)))], 2.0,
        (0, "rank 0 got SIGTERM (tore itself down, exited with code 0)", 1.0)),
    "the earliest of two established faults": Case(
        [RankState(0, leaving(5, 1.5, 2)), RankState(1, ledger(world(5)), 4, 1.2)], 2.0,
        (1, "rank 1 exited with code 4", 1.2)),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_first_fault(case: Case) -> None:
    fault = first_fault(case.states, case.now, WINDOW, HANG)
    if case.root is None:
        assert fault is None
    else:
        assert fault is not None
        assert (fault.rank, fault.describe(), fault.at) == case.root


@pytest.mark.parametrize("ops, blamed", [
    ([(0, "recv"), (1, "barrier")], [0, 1]),
    ([(0, "send"), (1, "recv")], []),
    ([(0, "recv_anysource"), (1, "send"), (2, "send")], []),
    ([(0, "all_reduce"), (1, "all_reduce"), (2, "barrier")], [2]),
    ([(0, "all_reduce"), (1, "all_reduce"), (2, "all_reduce")], []),
    ([(0, "broadcast"), (1, "broadcast"), (2, "barrier"), (3, "barrier")], [0, 1, 2, 3]),
    ([(0, "all_reduce"), (1, "all_reduce"), (2, "barrier"), (3, "recv")], [2, 3]),
])
def test_mismatch_blames_the_minority(ops, blamed) -> None:
    assert mismatched(tuple(ops)) == blamed


class _Reader:
    def __init__(self, progress: L.RankProgress) -> None:
        self.progress = progress

    def read(self) -> L.RankProgress:
        return self.progress


def _monitor(ledgers: dict[int, L.RankProgress], gone: tuple[int, ...] = ()) -> HangMonitor:
    """A monitor over fake ledgers, of processes that do not exist: every rank has made no
    progress since time 0."""
    monitor = HangMonitor(max(ledgers) + 1, HANG, 100.0)
    for rank, progress in ledgers.items():
        monitor.watch(rank, -1, _Reader(progress), 0.0)  # type: ignore[arg-type]
    for rank in gone:
        monitor.unwatch(rank)
    return monitor


def test_mismatched_operations_are_named_with_their_ranks_and_group() -> None:
    monitor = _monitor({0: ledger(world(32, 31, "recv", 1.0)),
                        1: ledger(world(32, 31, "barrier", 1.0))})
    [verdict] = monitor.check(1.0 + HANG)
    assert (verdict.hung, verdict.reason, verdict.blamed, verdict.group) == \
        (True, "mismatch", (0, 1), "world")
    assert verdict.describe() == ("mismatched operations #31 on group world: rank 0 in recv, "
                                  "rank 1 in barrier; they can never complete; blamed: ranks "
                                  "0,1; waited 3.0 s")


def test_matching_send_and_recv_are_no_mismatch() -> None:
    monitor = _monitor({0: ledger(world(32, 31, "send", 1.0)),
                        1: ledger(world(32, 31, "recv", 1.0))})
    [verdict] = monitor.check(1.0 + HANG)
    assert verdict.reason == "stuck_in_collective"


def test_sub_group_verdict_names_its_group() -> None:
    three = 0b111
    monitor = _monitor({0: ledger(world(6, members=three)),
                        1: ledger(world(6, members=three), sub(3, 2, "all_reduce", 1.0)),
                        2: ledger(world(6, members=three), sub(2, 2, "all_reduce", 0.5))})
    [verdict] = monitor.check(1.0 + HANG)
    assert (verdict.blamed, verdict.waiting, verdict.group) == ((2,), (1,), "ranks 1,2")
    assert verdict.describe().startswith("rank 2 never reached all_reduce #3 on group ranks "
                                         "1,2 (made no progress); rank 1 waited")


def test_rank_blamed_while_waiting_in_another_group_says_where_it_is() -> None:
    three = 0b111
    monitor = _monitor({0: ledger(world(7, 6, "all_reduce", 1.0, three)),
                        1: ledger(world(6, members=three), sub(1, 0, "barrier", 1.0)),
                        2: ledger(world(6, members=three), sub(0, 0, "none", 0.0))})
    verdicts = monitor.check(1.0 + HANG)
    assert [v.blamed for v in verdicts] == [(2,), (1, 2)]  # waiting nowhere comes first
    assert verdicts[0].group == "ranks 1,2"
    assert verdicts[1].elsewhere == ((1, "barrier #1 on group ranks 1,2"),)
    assert verdicts[1].describe().endswith("; rank 1 is in barrier #1 on group ranks 1,2")


@pytest.mark.parametrize("peer", [
    pytest.param(None, id="exited"),
    pytest.param(leaving(6, 0.5, 0), id="leaving with 0"),
    pytest.param(leaving(6, 0.5, 3), id="leaving with 3"),
    pytest.param(ledger(world(6), fault=L.FAULT_RAISED, t_fault=0.5), id="raised"),
])
def test_waiters_are_not_blamed_when_a_member_left_or_failed(peer) -> None:
    # rank 0 waits in all_reduce #6; rank 1 will never come: its own fault decides
    rank1 = peer if peer is not None else ledger(world(6))
    monitor = _monitor({0: ledger(world(7, 6, "all_reduce", 1.0)), 1: rank1},
                       gone=(1,) if peer is None else ())
    assert monitor.check(1.0 + 10 * HANG) == []
