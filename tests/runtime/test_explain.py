"""``bounded.explain``, case by case: the error a failed collective raises, built from fake
inputs (a group record, the peers' answers to the probe, gloo's error, a notice). It names the
operation and its sequence number, says why it failed, and names the ranks that had not
arrived with where each one was."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from rankguard.deadline import Deadline
from rankguard.errors import CollectiveTimeout, PeerFailed
from rankguard.runtime.bounded import explain
from rankguard.runtime.state import GroupRecord

WORLD = GroupRecord(name="world", ranks=[0, 1, 2, 3], rank=0, is_world=True)
PAIR = GroupRecord(name="1", ranks=[0, 2], rank=2, is_world=False)  # a sub-group, seen by rank 2
PASSED = Deadline(0.0, 30.0)  # an instant long gone: a 30 s budget that ran out
AHEAD = Deadline.never()


def at(entered: int, op: str = "all_reduce", world: bool = True,
       retired: str | None = None) -> dict[str, Any]:
    """A peer's answer to the probe: it entered ``entered`` operations, the last one ``op``."""
    return {"entered": entered, "done": entered, "op": op, "world": world, "retired": retired}


@dataclass
class Case:
    record: GroupRecord
    entry: int  # the failed operation's entry in the group's ledger slot
    limit: Deadline | None
    error: BaseException | None
    answers: dict[int, dict[str, Any] | None]
    reported: dict[str, Any] | None
    kind: type
    missing: list[int]
    says: list[str] = field(default_factory=list)


CASES = {
    "deadline passed, one peer a collective behind": Case(
        WORLD, 58, PASSED, RuntimeError("Timed out waiting 30000ms for recv operation"),
        {1: at(58), 2: at(57), 3: at(58)}, None, CollectiveTimeout, [2],
        ["rank 0: all_reduce #57 on group 'world' passed its deadline of 30 s after 30.00 s",
         "ranks that had not arrived: 2 (rank 2 was at all_reduce #56)"]),
    "deadline passed, gloo has not said so yet": Case(
        WORLD, 58, PASSED, None, {1: at(58), 2: at(58), 3: None}, None, CollectiveTimeout, [3],
        ["passed its deadline of 30 s",
         "ranks that had not arrived: 3 (rank 3 did not answer (stopped, dead, or holding the "
         "GIL))"]),
    "gloo timed out without a deadline of ours": Case(
        WORLD, 3, None, RuntimeError("[../third_party/gloo/pair.cc:534] Timed out"),
        {1: at(3), 2: at(3), 3: at(3)}, None, CollectiveTimeout, [],
        ["all_reduce #2 on group 'world' passed its deadline after"]),
    "a peer's connection closed": Case(
        WORLD, 11, AHEAD, RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:598] "
                                       "Connection closed by peer [127.0.0.1]:5000"),
        {1: None, 2: at(11), 3: at(11)}, None, PeerFailed, [1],
        ["all_reduce #10 on group 'world' failed because a peer failed (Connection closed by "
         "peer [127.0.0.1]:5000)", "ranks that had not arrived: 1"]),
    "the peers could not be asked": Case(
        WORLD, 11, AHEAD, RuntimeError("Connection reset by peer"), {}, None, PeerFailed, [],
        ["failed because a peer failed (Connection reset by peer)"]),
    "a peer reported the failure first": Case(
        WORLD, 58, AHEAD, None, {1: at(58), 2: at(58), 3: at(58)},
        {"by": 1, "op": "all_reduce", "seq": 57}, PeerFailed, [],
        ["all_reduce #57 on group 'world' was abandoned: rank 1 reported that all_reduce #57 "
         "failed"]),
    "a peer gave up on the group with a reason": Case(
        WORLD, 5, AHEAD, None, {1: at(4), 2: at(5), 3: at(5)},
        {"by": 1, "reason": "rank 1 failed test_x"}, PeerFailed, [1],
        ["was abandoned: rank 1 failed test_x", "rank 1 was at all_reduce #3"]),
    "the supervisor reported a hung rank": Case(
        WORLD, 41, AHEAD, None, {1: at(41), 2: at(40), 3: at(41)},
        {"supervisor": True, "kind": "hung", "rank": 2}, PeerFailed, [2],
        ["all_reduce #40 on group 'world' was abandoned: the supervisor reported that rank 2 "
         "hung", "rank 2 was at all_reduce #39"]),
    "the supervisor reported a rank it could not name": Case(
        WORLD, 41, AHEAD, None, {1: at(41), 2: at(41), 3: at(41)},
        {"supervisor": True, "kind": "died", "rank": -1}, PeerFailed, [],
        ["the supervisor reported that a rank died"]),
    "a sub-group whose peer never entered it": Case(
        PAIR, 1, PASSED, None, {0: at(0, "none", world=False)}, None, CollectiveTimeout, [0],
        ["rank 2: all_reduce #1 on group '1' passed its deadline",
         "ranks that had not arrived: 0 (rank 0 had not entered any collective)"]),
    "a peer arrived, then gave up": Case(
        WORLD, 7, PASSED, None,
        {1: at(7, retired="terminating (SIGTERM)"), 2: at(6), 3: at(7)}, None,
        CollectiveTimeout, [2], ["ranks that had not arrived: 2 (rank 2 was at all_reduce #5)"]),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_explain_names_the_operation_its_number_and_the_ranks_not_arrived(case: Case) -> None:
    error = explain(case.record, case.entry, "all_reduce", 30.0, case.limit, case.error,
                    case.answers, case.reported)
    assert type(error) is case.kind, error
    assert error.missing == case.missing, error
    assert (error.op, error.group, error.rank) == ("all_reduce", case.record.name,
                                                   case.record.rank)
    for words in case.says:
        assert words in str(error), str(error)
    assert str(error).endswith("The process group is retired: call rankguard.regroup() or exit.")


def test_a_peer_that_arrived_then_gave_up_is_described_but_not_missing() -> None:
    case = CASES["a peer arrived, then gave up"]
    error = explain(case.record, case.entry, "all_reduce", 1.0, case.limit, case.error,
                    case.answers, case.reported)
    assert error.peers[1] == "arrived, then gave up (terminating (SIGTERM))"
    assert 1 not in error.missing


def test_a_long_gloo_message_is_cut_to_its_first_line() -> None:
    text = "[../third_party/gloo/pair.cc:1] " + "x" * 400 + "\nsecond line"
    error = explain(WORLD, 2, "broadcast", 0.5, AHEAD, RuntimeError(text), {}, None)
    assert "x" * 157 + "..." in str(error) and "second line" not in str(error)
    assert "third_party" not in str(error)


DEADLINE_FIGURES = {  # case: (seconds left of the 30 s deadline when it began, waited, says)
    "the operation began with the deadline's whole budget": (30.0, 30.0,
                                                            "passed its deadline of 30 s after "
                                                            "30.00 s"),
    "the deadline was made before the operation began (a test's, an enclosing block's)":
        (8.0, 8.0, "passed its deadline (8.00 s away when it began) after 8.00 s"),
}


@pytest.mark.parametrize(("left", "waited", "says"), DEADLINE_FIGURES.values(),
                         ids=DEADLINE_FIGURES.keys())
def test_a_timeout_names_the_time_the_operation_had_not_a_budget_it_never_had(
        left: float, waited: float, says: str) -> None:
    error = explain(WORLD, 58, "all_reduce", waited, PASSED, None, {1: at(58), 2: at(58),
                                                                    3: at(58)},
                    None, left_at_start=left)
    assert says in str(error), str(error)
