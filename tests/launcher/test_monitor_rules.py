"""Hang vs straggler vs mismatch vs stuck_in_collective vs stopped, who is blamed, and what is
reported when: the hang monitor's rules, table-driven over fake ledger snapshots and process
activity (no processes, no clock; milliseconds in all).

The end-to-end runs that prove the same on real ranks, signals and /proc are in
test_faults.py and test_blame_end_to_end.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from rankguard.records import ledger as L
from rankguard.launcher.monitor import (BUSY_RECENT_S, Activity, HangMonitor, HangRules,
                                        ReportedOnce, Verdict, group_label, mismatched)
from tests.launcher.snapshots import group, leaving, ledger, nccl, sub, world

HANG, STRAGGLER = 3.0, 20.0
T = 1.0  # when the waiters entered the operation they wait in
THREE, FOUR = 0b111, 0b1111

FROZEN = Activity(idle_s=HANG)  # no progress for --hang-timeout
QUIET = Activity(idle_s=(BUSY_RECENT_S + HANG) / 2)  # went quiet lately: neither busy nor frozen
BUSY = Activity(idle_s=BUSY_RECENT_S / 2)
STOPPED = Activity(idle_s=0.0, stopped=True)  # stopped even though it progressed lately

# (hung, blamed, waiting, reason, the operation's label)
Row = tuple[bool, tuple[int, ...], tuple[int, ...], str, str]


@dataclass
class Case:
    ledgers: dict[int, L.RankProgress]
    now: float
    verdicts: list[Row]
    activity: dict[int, Activity] = field(default_factory=dict)  # others: idle since time 0
    gone: tuple[int, ...] = ()


def _judge(case: Case) -> list[Verdict]:
    size = max([*case.ledgers, *case.gone]) + 1
    activity = {rank: case.activity.get(rank, Activity(case.now)) for rank in case.ledgers}
    return HangRules(size, HANG, STRAGGLER).judge(case.ledgers, activity, case.gone, case.now)


def _rows(verdicts: list[Verdict]) -> list[Row]:
    return [(v.hung, v.blamed, v.waiting, v.reason, v.op_label) for v in verdicts]


# rank 0 waits in all_reduce #10 (world entry 11) since T; rank 1 never entered it
WAITS_FOR_1 = {0: ledger(world(11, 10, t_enter=T)), 1: ledger(world(10))}
# the elsewhere case: rank 0 waits in all_reduce #6 of the world, rank 1 in barrier #1 of
# group 1,2, rank 2 in neither
CROSSED = {0: ledger(world(7, 6, "all_reduce", T, THREE)),
           1: ledger(world(6, members=THREE), sub(1, 0, "barrier", T)),
           2: ledger(world(6, members=THREE), sub(0, 0, "none", 0.0))}

# rank 1 froze before all_reduce #11, its #10 not recorded done (completions lag); rank 0 waits
# in #11 since T, its #10's completion recorded only at T + 1 (its last event)
FROZEN_BEHIND = {0: ledger(replace(world(12, 11, t_enter=T), t_done=T + 1.0)),
                 1: ledger(world(11, 10, t_enter=T - 0.5))}

CASES = {
    # -- an absent rank -------------------------------------------------------------------------
    "a frozen absent rank is hung (no_progress)": Case(
        WAITS_FOR_1, T + HANG, [(True, (1,), (0,), "no_progress", "all_reduce #10")],
        {1: FROZEN}),
    "a stopped absent rank is hung (stopped), however lately it progressed": Case(
        WAITS_FOR_1, T + HANG, [(True, (1,), (0,), "stopped", "all_reduce #10")], {1: STOPPED}),
    "every rank waiting in the operation is named, one that entered it last included": Case(
        {0: ledger(world(41, 40, t_enter=T, members=FOUR)),
         1: ledger(replace(world(41, 40, t_enter=T + 2.0, members=FOUR), t_done=T + 1.9)),
         2: ledger(world(40, members=FOUR)),
         3: ledger(world(41, 40, t_enter=T, members=FOUR))},
        T + HANG, [(True, (2,), (0, 1, 3), "no_progress", "all_reduce #40")], {2: FROZEN}),
    "nothing is judged before the waiters waited hang_timeout": Case(
        WAITS_FOR_1, T + HANG - 0.01, [], {1: STOPPED}),
    "a busy absent rank is a straggler, reported and not blamed (busy)": Case(
        WAITS_FOR_1, T + HANG, [(False, (1,), (0,), "busy", "all_reduce #10")], {1: BUSY}),
    "a busy straggler is blamed once the waiters waited straggler_timeout": Case(
        WAITS_FOR_1, T + STRAGGLER,
        [(True, (1,), (0,), "straggler_timeout", "all_reduce #10")], {1: BUSY}),
    "a straggler that went quiet is blamed at straggler_timeout too": Case(
        WAITS_FOR_1, T + STRAGGLER,
        [(True, (1,), (0,), "straggler_timeout", "all_reduce #10")], {1: QUIET}),
    "a rank that went quiet only lately gets no verdict yet": Case(
        WAITS_FOR_1, T + HANG, [], {1: QUIET}),
    "a rank whose process took its place after the waiters entered is not waited for": Case(
        {0: ledger(world(11, 10, t_enter=T)), 1: ledger(world(2), t_start=T + 0.5)},
        T + STRAGGLER, [], {1: BUSY}),
    "a rank that took its place before the waiters entered is": Case(
        {0: ledger(world(11, 10, t_enter=T)), 1: ledger(world(10), t_start=T - 0.5)},
        T + HANG, [(True, (1,), (0,), "stopped", "all_reduce #10")], {1: STOPPED}),
    "a rank frozen before its next operation, whose last one is not recorded done, is not the "
    "waiter, though in it longer than the rank ahead: no verdict until that one waited": Case(
        FROZEN_BEHIND, T + HANG, [], {1: STOPPED}),
    "... then the verdict names the operation it never reached, and the rank ahead as waiter":
        Case(FROZEN_BEHIND, T + 1.0 + HANG, [(True, (1,), (0,), "stopped", "all_reduce #11")],
             {1: STOPPED}),
    "a completed collective is no wait": Case(
        {0: ledger(world(11, t_enter=T)), 1: ledger(world(11, t_enter=T))}, T + 10 * HANG, []),
    "a rank frozen before init_process_group is blamed for it": Case(
        {0: ledger(world(1, 0, "init_process_group", T)), 1: ledger(world(0, kind="none"))},
        T + HANG, [(True, (1,), (0,), "no_progress", "init_process_group")]),
    "a rank frozen before recording its last completion is behind, not waiting": Case(
        {0: ledger(world(11, 10, t_enter=T)), 1: ledger(world(10, 9, t_enter=T - 0.5))},
        T + HANG, [(True, (1,), (0,), "no_progress", "all_reduce #10")], {1: FROZEN}),
    "several frozen absent ranks are all blamed, the busy one not": Case(
        {0: ledger(world(11, 10, t_enter=T, members=FOUR)),
         1: ledger(world(10, members=FOUR)), 2: ledger(world(10, members=FOUR)),
         3: ledger(world(10, members=FOUR))}, T + HANG,
        [(True, (1, 3), (0,), "no_progress", "all_reduce #10")],
        {1: FROZEN, 2: BUSY, 3: FROZEN}),
    "a stopped absent rank is blamed alone, before frozen ones": Case(
        {0: ledger(world(11, 10, t_enter=T, members=THREE)),
         1: ledger(world(10, members=THREE)), 2: ledger(world(10, members=THREE))},
        T + HANG, [(True, (2,), (0,), "stopped", "all_reduce #10")], {1: FROZEN, 2: STOPPED}),
    # -- every member arrived -------------------------------------------------------------------
    "different operations of one number, none a majority: a mismatch blaming all": Case(
        {0: ledger(world(32, 31, "recv", T)), 1: ledger(world(32, 31, "barrier", T))},
        T + HANG, [(True, (0, 1), (0, 1), "mismatch", "recv #31")]),
    "a mismatch blames the minority's operation": Case(
        {0: ledger(world(32, 31, "all_reduce", T, THREE)),
         1: ledger(world(32, 31, "all_reduce", T, THREE)),
         2: ledger(world(32, 31, "barrier", T, THREE))},
        T + HANG, [(True, (2,), (0, 1, 2), "mismatch", "all_reduce #31")]),
    "a send meets a recv: no mismatch, but stuck_in_collective on all": Case(
        {0: ledger(world(32, 31, "send", T)), 1: ledger(world(32, 31, "recv", T))},
        T + HANG, [(True, (0, 1), (0, 1), "stuck_in_collective", "send #31")]),
    "all arrived and nothing completes: the idle member that did its part is blamed": Case(
        {0: ledger(world(11, 10, t_enter=T, members=THREE)),
         1: ledger(world(11, 10, t_enter=T, members=THREE)),
         2: ledger(world(11, t_enter=T, members=THREE))},
        T + HANG, [(True, (2,), (0, 1), "stuck_in_collective", "all_reduce #10")],
        {2: FROZEN}),
    "all arrived and nothing completes, none stands out: all are blamed": Case(
        {0: ledger(world(11, 10, t_enter=T, members=THREE)),
         1: ledger(world(11, 10, t_enter=T, members=THREE)),
         2: ledger(world(11, t_enter=T, members=THREE))},
        T + HANG, [(True, (0, 1, 2), (0, 1), "stuck_in_collective", "all_reduce #10")],
        {2: BUSY}),
    "all arrived and a member is stopped: it is blamed (stopped)": Case(
        {0: ledger(world(11, 10, t_enter=T)), 1: ledger(world(11, 10, t_enter=T))},
        T + HANG, [(True, (1,), (0,), "stopped", "all_reduce #10")], {1: STOPPED}),
    "the last arrival is too recent: the operation gets hang_timeout to complete": Case(
        {0: ledger(world(11, 10, t_enter=T)), 1: ledger(world(11, 10, t_enter=T + HANG - 0.5))},
        T + HANG, []),
    "hang_timeout after the last arrival, the operation is stuck": Case(
        {0: ledger(world(11, 10, t_enter=T)), 1: ledger(world(11, 10, t_enter=T + HANG - 0.5))},
        T + 2 * HANG - 0.5, [(True, (0, 1), (0, 1), "stuck_in_collective", "all_reduce #10")]),
    # -- sub-groups -----------------------------------------------------------------------------
    "a sub-group's verdict names its members (ranks 0,2)": Case(
        {0: ledger(world(6, members=THREE), group(3, 2, "all_reduce", T, 0b101, "a")),
         1: ledger(world(6, members=THREE)),
         2: ledger(world(6, members=THREE), group(2, 2, "all_reduce", 0.5, 0b101, "a"))},
        T + HANG, [(True, (2,), (0,), "no_progress", "all_reduce #3 on group ranks 0,2")]),
    "a member without the sub-group's slot has entered none of it": Case(
        {0: ledger(world(6, members=THREE), group(1, 0, "barrier", T, 0b101, "a")),
         1: ledger(world(6, members=THREE)), 2: ledger(world(6, members=THREE))},
        T + HANG, [(True, (2,), (0,), "no_progress", "barrier #1 on group ranks 0,2")]),
    "a hang blaming ranks that wait nowhere comes before one blaming a rank waiting elsewhere":
        Case(CROSSED, T + HANG, [(True, (2,), (1,), "no_progress", "barrier #1 on group ranks 1,2"),
                                 (True, (1, 2), (0,), "no_progress", "all_reduce #6")]),
    "hangs come before straggler reports": Case(
        {0: ledger(world(5, members=FOUR), group(4, 3, "barrier", T, 0b0011, "a")),
         1: ledger(world(5, members=FOUR), group(3, 3, "barrier", 0.5, 0b0011, "a")),
         2: ledger(world(5, members=FOUR), group(4, 3, "barrier", T, 0b1100, "b")),
         3: ledger(world(5, members=FOUR), group(3, 3, "barrier", 0.5, 0b1100, "b"))},
        T + HANG, [(True, (3,), (2,), "no_progress", "barrier #4 on group ranks 2,3"),
                   (False, (1,), (0,), "busy", "barrier #4 on group ranks 0,1")],
        {1: BUSY, 3: FROZEN}),
    # -- a member with a fault of its own: its fault decides ------------------------------------
    "a group whose member exited is not judged": Case(
        {0: ledger(world(7, 6, "all_reduce", T))}, T + 10 * HANG, [], gone=(1,)),
    "a group whose member is leaving with code 0 is not judged": Case(
        {0: ledger(world(7, 6, "all_reduce", T)), 1: leaving(6, 0.5, 0)}, T + 10 * HANG, []),
    "a group whose member is leaving with code 3 is not judged": Case(
        {0: ledger(world(7, 6, "all_reduce", T)), 1: leaving(6, 0.5, 3)}, T + 10 * HANG, []),
    "a group whose member raised is not judged": Case(
        {0: ledger(world(7, 6, "all_reduce", T)),
         1: ledger(world(6), fault=L.FAULT_RAISED, t_fault=0.5)}, T + 10 * HANG, []),
    "a group whose member got SIGTERM is not judged": Case(
        {0: ledger(world(7, 6, "all_reduce", T)),
         1: ledger(world(6), fault=L.FAULT_TERMINATED, t_fault=0.5)}, T + 10 * HANG, []),
    "a group without the faulty member is still judged": Case(
        {0: ledger(world(6, members=THREE), group(3, 2, "barrier", T, 0b011, "a")),
         1: ledger(world(7, 6, "all_reduce", T, THREE), group(2, 2, "barrier", 0.5, 0b011, "a")),
         2: ledger(world(6, members=THREE), fault=L.FAULT_RAISED, t_fault=0.5)},
        T + HANG, [(True, (1,), (0,), "no_progress", "barrier #3 on group ranks 0,1")]),
}

# NCCL: rank 0's CPU enqueued up to #103 and its GPU started #54; its completions stopped at
# #53 at time T
AHEAD = nccl(103, 54, 53, t_enter=T, t_done=T)
# rank 1 stopped enqueuing after #53 (a Python-side hang) and completed it
STOPPED_AT_53 = nccl(53, 53, 53, t_enter=T - 1.0, t_done=T - 0.5)
# rank 1's CPU enqueued everything but its GPU never started #54 (a kernel before it is stuck)
GPU_HELD = nccl(103, 53, 53, t_enter=T, t_done=T)
# three ranks on NCCL, a sub-group of ranks 0,2: rank 0 waits in its #8, rank 2 never enqueued it
SUB_AHEAD = nccl(9, 8, 7, t_enter=T, t_done=T, members=0b101, name="a")
SUB_BEHIND = nccl(7, 7, 7, t_enter=T - 1.0, t_done=T - 1.0, members=0b101, name="a")
NCCL_IDLE = nccl(60, 60, 60, members=THREE)  # their world group: every operation completed
# a 2x2 DeviceMesh, tp groups 0,1 and 2,3, dp groups 0,2 and 1,3: rank 1 stopped after tp #2,
# before dp #2, where rank 3 waits since T - 0.5; ranks 0 and 2 went on to wait in tp #3 since T
TP01, TP23, DP02, DP13 = (dict(members=m, name=n) for m, n in (
    (0b0011, "tp01"), (0b1100, "tp23"), (0b0101, "dp02"), (0b1010, "dp13")))
MESH = {0: ledger(nccl(2, 2, 2, **DP02), nccl(3, 3, 2, T, T, **TP01)),
        1: ledger(nccl(2, 2, 2, **TP01), nccl(1, 1, 1, **DP13)),
        2: ledger(nccl(2, 2, 2, **DP02), nccl(3, 3, 2, T, T, **TP23)),
        3: ledger(nccl(2, 2, 2, **TP23), nccl(2, 2, 1, T - 0.5, T - 0.5, **DP13))}

ASYNC_CASES = {
    # -- (a) a member never enqueued the operation ----------------------------------------------
    "NCCL (a): a rank that never enqueued #k while its peer did is hung when frozen": Case(
        {0: ledger(AHEAD), 1: ledger(STOPPED_AT_53)}, T + HANG,
        [(True, (1,), (0,), "no_progress", "all_reduce #54")], {1: FROZEN}),
    "NCCL (a): ... stopped (SIGSTOP)": Case(
        {0: ledger(AHEAD), 1: ledger(STOPPED_AT_53)}, T + HANG,
        [(True, (1,), (0,), "stopped", "all_reduce #54")], {1: STOPPED}),
    "NCCL (a): ... and a busy one is a straggler, reported, not blamed": Case(
        {0: ledger(AHEAD), 1: ledger(STOPPED_AT_53)}, T + HANG,
        [(False, (1,), (0,), "busy", "all_reduce #54")], {1: BUSY}),
    "NCCL (a): the wait counts from when the waiters' completions stopped, not from their last "
    "enqueue": Case(
        {0: ledger(replace(AHEAD, t_enter=T + HANG - 0.1)), 1: ledger(STOPPED_AT_53)}, T + HANG,
        [(True, (1,), (0,), "no_progress", "all_reduce #54")], {1: FROZEN}),
    "NCCL: nothing is judged before the waiters' completions stood still for hang_timeout": Case(
        {0: ledger(AHEAD), 1: ledger(STOPPED_AT_53)}, T + HANG - 0.01, [], {1: STOPPED}),
    "NCCL (a): a rank that never made the group is blamed for its first collective": Case(
        {0: ledger(nccl(1, 1, 0, t_enter=T, t_done=T)), 1: ledger()}, T + HANG,
        [(True, (1,), (0,), "no_progress", "all_reduce #1")], {1: FROZEN}),
    "NCCL (a): a rank whose record lags behind a completion its peer saw is not what the group "
    "waits for: it never enqueued the next one": Case(
        {0: ledger(nccl(11, 11, 10, t_enter=T, t_done=T)),
         1: ledger(nccl(10, 10, 9, t_enter=T - 0.5, t_done=T - 1.0))}, T + HANG,
        [(True, (1,), (0,), "stopped", "all_reduce #11")], {1: STOPPED}),
    "NCCL (a): a sub-group's verdict names its members": Case(
        {0: ledger(NCCL_IDLE, SUB_AHEAD), 1: ledger(NCCL_IDLE), 2: ledger(NCCL_IDLE, SUB_BEHIND)},
        T + HANG, [(True, (2,), (0,), "no_progress", "all_reduce #8 on group ranks 0,2")],
        {2: FROZEN}),
    # -- (b) every member enqueued it, a GPU never started it -----------------------------------
    "NCCL (b): a rank whose GPU never started #k while its peer's did is blamed": Case(
        {0: ledger(AHEAD), 1: ledger(GPU_HELD)}, T + HANG,
        [(True, (1,), (0,), "never_started", "all_reduce #54")]),
    "NCCL (b): no GPU started #k: every rank is blamed": Case(
        {0: ledger(GPU_HELD), 1: ledger(GPU_HELD)}, T + HANG,
        [(True, (0, 1), (), "never_started", "all_reduce #54")]),
    "NCCL (b): a member that enqueued lately gets hang_timeout for its GPU to start it": Case(
        {0: ledger(AHEAD), 1: ledger(replace(GPU_HELD, t_enter=T + 1.0))}, T + HANG, []),
    "NCCL (b): ... then it is blamed": Case(
        {0: ledger(AHEAD), 1: ledger(replace(GPU_HELD, t_enter=T + 1.0))}, T + 1.0 + HANG,
        [(True, (1,), (0,), "never_started", "all_reduce #54")]),
    # -- (c) every member started it, none completed it -----------------------------------------
    "NCCL (c): every rank started #k and none completed it: the group is stuck in it": Case(
        {0: ledger(AHEAD), 1: ledger(AHEAD)}, T + HANG,
        [(True, (0, 1), (0, 1), "never_completed", "all_reduce #54")]),
    "NCCL (c): started not known (timing off) on every rank: stuck_in_collective": Case(
        {0: ledger(replace(AHEAD, started=-1)), 1: ledger(replace(AHEAD, started=-1))},
        T + HANG, [(True, (0, 1), (0, 1), "stuck_in_collective", "all_reduce #54")]),
    "gloo through the recorder (c): every rank enqueued #k, none completed it, none has a GPU: "
    "stuck_in_collective": Case(
        {0: ledger(replace(AHEAD, started=-1, on_host=True)),
         1: ledger(replace(AHEAD, started=-1, on_host=True))},
        T + HANG, [(True, (0, 1), (0, 1), "stuck_in_collective", "all_reduce #54")]),
    "NCCL (c): a stopped rank, whose CPU drives the collective's network side, is blamed alone":
        Case({0: ledger(AHEAD), 1: ledger(AHEAD)}, T + HANG,
             [(True, (1,), (0,), "stopped", "all_reduce #54")], {1: STOPPED}),
    "NCCL (a): of two hangs blaming the same rank, the one waited longest comes first (its "
    "next operation; the later wait is a consequence)": Case(MESH, T + HANG, [
        (True, (1,), (3,), "no_progress", "all_reduce #2 on group ranks 1,3"),
        (True, (1,), (0,), "no_progress", "all_reduce #3 on group ranks 0,1"),
        (True, (3,), (2,), "no_progress", "all_reduce #3 on group ranks 2,3")]),
    "NCCL: every operation completed is no wait": Case(
        {0: ledger(nccl(60, 60, 60, T, T)), 1: ledger(nccl(60, 60, 60, T, T))},
        T + 10 * HANG, []),
    "NCCL: a group whose member exited is not judged": Case(
        {0: ledger(AHEAD)}, T + 10 * HANG, [], gone=(1,)),
}


@pytest.mark.parametrize("case", [*CASES.values(), *ASYNC_CASES.values()],
                         ids=[*CASES, *ASYNC_CASES])
def test_verdicts(case: Case) -> None:
    assert _rows(_judge(case)) == case.verdicts


@pytest.mark.parametrize("key, text", [
    ("NCCL (a): a rank that never enqueued #k while its peer did is hung when frozen",
     "rank 1 never enqueued all_reduce #54 (made no progress); rank 0 waited 3.0 s"),
    ("NCCL (b): a rank whose GPU never started #k while its peer's did is blamed",
     "rank 1 enqueued all_reduce #54 on group world but its GPU never started it: a kernel "
     "before it is stuck; rank 0 waited 3.0 s"),
    ("NCCL (b): no GPU started #k: every rank is blamed",
     "ranks 0,1 enqueued all_reduce #54 on group world but their GPUs never started it: a "
     "kernel before it is stuck; waited 3.0 s"),
    ("NCCL (c): every rank started #k and none completed it: the group is stuck in it",
     "ranks 0,1 started all_reduce #54 on group world on the GPU but none completed it: stuck "
     "inside the collective (NCCL or the network); waited 3.0 s"),
    ("NCCL (c): started not known (timing off) on every rank: stuck_in_collective",
     "ranks 0,1 enqueued all_reduce #54 on group world but none completed it (whether a GPU "
     "started it is not known: TORCH_NCCL_ENABLE_TIMING is off); waited 3.0 s"),
    ("gloo through the recorder (c): every rank enqueued #k, none completed it, none has a GPU: "
     "stuck_in_collective",
     "ranks 0,1 enqueued all_reduce #54 on group world but none completed it: stuck inside the "
     "collective (gloo or the network); waited 3.0 s"),
])
def test_an_nccl_verdict_names_the_ranks_operation_group_and_side(key: str, text: str) -> None:
    [verdict] = _judge(ASYNC_CASES[key])
    assert verdict.describe() == text
    assert Verdict.from_record(verdict.record()) == verdict


def test_a_sub_groups_verdict_carries_its_members_as_data_and_the_worlds_none() -> None:
    [verdict] = _judge(CASES["a sub-group's verdict names its members (ranks 0,2)"])
    assert verdict.members == (0, 2)
    assert Verdict.from_record(verdict.record()) == verdict
    [world_verdict] = _judge(ASYNC_CASES[
        "NCCL (a): a rank that never enqueued #k while its peer did is hung when frozen"])
    assert world_verdict.members == ()


def test_blamed_rank_waiting_in_another_group_is_named_with_where_it_waits() -> None:
    group_verdict, world_verdict = _judge(Case(CROSSED, T + HANG, []))
    assert group_verdict.elsewhere == ()
    assert world_verdict.elsewhere == ((1, "barrier #1 on group ranks 1,2"),)
    assert world_verdict.describe() == (
        "ranks 1,2 never reached all_reduce #6 (made no progress); rank 0 waited 3.0 s; "
        "rank 1 is in barrier #1 on group ranks 1,2")


def test_blamed_rank_still_in_an_earlier_operation_of_the_group_is_named_with_it() -> None:
    """gloo's ring completes on some ranks first: rank 1 still waits in all_reduce #9, which
    rank 0 got past (its data is due from a peer, perhaps on a node that went silent)."""
    case = CASES["a rank frozen before recording its last completion is behind, not waiting"]
    [verdict] = _judge(case)
    assert verdict.elsewhere == ((1, "all_reduce #9"),)
    assert verdict.describe() == ("rank 1 never reached all_reduce #10 (made no progress); "
                                  "rank 0 waited 3.0 s; rank 1 is in all_reduce #9")


def test_mismatch_names_each_ranks_operation() -> None:
    case = CASES["a mismatch blames the minority's operation"]
    [verdict] = _judge(case)
    assert verdict.ops == ((0, "all_reduce"), (1, "all_reduce"), (2, "barrier"))
    assert verdict.describe() == ("mismatched operations #31 on group world: ranks 0,1 in "
                                  "all_reduce, rank 2 in barrier; they can never complete; "
                                  "blamed: rank 2; waited 3.0 s")


def test_waited_is_the_longest_wait_among_the_waiters_and_the_verdict_names_its_group() -> None:
    ledgers = {0: ledger(world(11, 10, t_enter=T, members=THREE)),
               1: ledger(world(11, 10, t_enter=T + 0.5, members=THREE)),
               2: ledger(world(10, members=THREE))}
    [verdict] = _judge(Case(ledgers, T + 0.5 + HANG, []))
    assert (verdict.waiting, verdict.waited_s) == ((0, 1), HANG + 0.5)
    assert (verdict.group_key, verdict.group, verdict.seq) == (L.group_key("world"), "world", 10)


# (now, rank 1's activity, what the check passes on: (hung, reason))
TIMELINE: list[tuple[float, Activity, list[tuple[bool, str]]]] = [
    (T + HANG - 0.1, BUSY, []),
    (T + HANG, BUSY, [(False, "busy")]),
    (T + HANG + 1.0, BUSY, []),  # reported once
    (T + HANG + 2.0, QUIET, []),
    (T + HANG + 3.0, BUSY, []),  # busy again: the same report, not again
    (T + STRAGGLER, BUSY, [(True, "straggler_timeout")]),
    (T + STRAGGLER + 0.2, BUSY, [(True, "straggler_timeout")]),  # a hang, at every check
]


def test_a_straggler_is_reported_once_then_blamed_at_straggler_timeout_at_every_check() -> None:
    rules, reported = HangRules(2, HANG, STRAGGLER), ReportedOnce()
    seen = []
    for now, activity, _ in TIMELINE:
        verdicts = reported.new(rules.judge(WAITS_FOR_1, {0: FROZEN, 1: activity}, (), now))
        seen.append([(v.hung, v.reason) for v in verdicts])
    assert seen == [expected for _, _, expected in TIMELINE]


def test_a_straggler_is_reported_again_at_another_operation_or_for_another_rank() -> None:
    rules, reported = HangRules(3, HANG, STRAGGLER), ReportedOnce()
    busy = {0: FROZEN, 1: BUSY, 2: BUSY}

    def report(ledgers: dict[int, L.RankProgress], now: float) -> list[tuple[int, ...]]:
        return [v.blamed for v in reported.new(rules.judge(ledgers, busy, (), now))]

    behind_1 = {0: ledger(world(11, 10, t_enter=T, members=THREE)),
                1: ledger(world(10, members=THREE)), 2: ledger(world(11, t_enter=T, members=THREE))}
    assert report(behind_1, T + HANG) == [(1,)]
    assert report(behind_1, T + HANG + 1) == []
    later = T + 10.0  # the next operation: rank 2 is behind in it
    behind_2 = {0: ledger(world(12, 11, t_enter=later, members=THREE)),
                1: ledger(world(12, t_enter=later, members=THREE)),
                2: ledger(world(11, members=THREE))}
    assert report(behind_2, later + HANG) == [(2,)]
    behind_1_again = {0: ledger(world(12, 11, t_enter=later, members=THREE)),
                      1: ledger(world(11, members=THREE)),
                      2: ledger(world(12, t_enter=later, members=THREE))}
    assert report(behind_1_again, later + HANG) == [(1,)]


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


@pytest.mark.parametrize("slot, label", [
    (world(3), "world"),
    (sub(3, members=0b101), "ranks 0,2"),
    (sub(3, members=1 << 63 | 1), "ranks 0,63"),
    # a mixed default group's gloo half (cpu:gloo,cuda:nccl): every rank, named as the world's
    (group(3, members=0b11, name="world/gloo"), "world/gloo"),
])
def test_group_label_is_world_or_its_members(slot, label) -> None:
    assert group_label(slot) == label



VERDICT = dict(hung=True, blamed=(2,), waiting=(0, 1), op="all_reduce", seq=40, waited_s=3.24)


@pytest.mark.parametrize("fields, text", [
    (dict(reason="no_progress"),
     "rank 2 never reached all_reduce #40 (made no progress); ranks 0,1 waited 3.2 s"),
    (dict(reason="stopped"),
     "rank 2 never reached all_reduce #40 (stopped (SIGSTOP)); ranks 0,1 waited 3.2 s"),
    (dict(reason="stopped", inside=True, blamed=(1,), waiting=(0,)),
     "rank 1 was stopped (SIGSTOP) inside all_reduce #40; rank 0 waited 3.2 s"),
    (dict(reason="stopped", inside=True, blamed=(0, 1), waiting=()),
     "ranks 0,1 were stopped (SIGSTOP) inside all_reduce #40; waited 3.2 s"),
    (dict(reason="busy", hung=False),
     "rank 2 never reached all_reduce #40 (busy); ranks 0,1 waited 3.2 s"),
    (dict(reason="straggler_timeout"),
     "rank 2 never reached all_reduce #40 (busy past --straggler-timeout); ranks 0,1 waited "
     "3.2 s"),
    (dict(reason="collective_deadline", waiting=(0,)),
     "rank 2 never reached all_reduce #40 (named by a rank that gave up waiting for it); rank 0 "
     "waited 3.2 s"),
    (dict(reason="stuck_in_collective", blamed=(0, 1, 2), group="ranks 0,1,2"),
     "ranks 0,1,2 entered all_reduce #40 on group ranks 0,1,2 but it never completed; ranks 0,1 "
     "waited 3.2 s"),
    (dict(reason="mismatch", blamed=(0, 1), ops=((0, "recv"), (1, "barrier"))),
     "mismatched operations #40 on group world: rank 0 in recv, rank 1 in barrier; they can "
     "never complete; blamed: ranks 0,1; waited 3.2 s"),
])
def test_each_reason_is_described_in_words(fields, text) -> None:
    assert Verdict(**{**VERDICT, **fields}).describe() == text


class _Reader:
    def __init__(self, progress: L.RankProgress) -> None:
        self.progress = progress

    def read(self) -> L.RankProgress:
        return self.progress


def test_monitor_feeds_the_rules_from_its_readers_and_skips_groups_of_exited_ranks() -> None:
    # processes that do not exist: /proc has nothing, so each rank is idle since its watch
    monitor = HangMonitor(3, HANG, STRAGGLER)
    ledgers = CASES["a group without the faulty member is still judged"].ledgers
    for rank, progress in ledgers.items():
        monitor.watch(rank, -1, _Reader(progress), 0.0)  # type: ignore[arg-type]
    assert _rows(monitor.check(T + HANG)) == \
        [(True, (1,), (0,), "no_progress", "barrier #3 on group ranks 0,1")]
    monitor.unwatch(1)
    assert monitor.check(T + HANG) == []
    assert set(monitor.snapshot()) == {0, 2}
