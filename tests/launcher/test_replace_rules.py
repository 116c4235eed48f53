"""Whether a fault is repaired in place (``launcher.replace_rules.refusal``), as a table: each
row a sentence, the fault and the ranks as the agent sees them, and the reason it gives."""

from __future__ import annotations

import pytest

from rankguard.launcher.outcome import FaultKind
from rankguard.launcher.replace_rules import Member, culprits, refusal

UP = Member(alive=True)
JOINING = Member(alive=True, joining=True)
GONE = Member(alive=False)
DONE = Member(alive=False, ended_well=True)

ROWS: dict[str, tuple[FaultKind, set[int], dict[int, Member], int, int, str | None]] = {
    "one rank of two died and its peer runs StepLoop: replaced":
        (FaultKind.SIGNALLED, {1}, {0: UP, 1: GONE}, 5, 2, None),
    "a single rank: no other rank holds the state":
        (FaultKind.SIGNALLED, {0}, {0: GONE}, 5, 1, "no other rank holds the state"),
    "every rank is a culprit: no other rank holds the state":
        (FaultKind.HUNG, {0, 1}, {0: UP, 1: UP}, 5, 2, "no other rank holds the state"),
    "the peer died while the first culprit's replacement joins: nobody holds the state":
        (FaultKind.SIGNALLED, {0}, {0: GONE, 1: JOINING}, 5, 2,
         "rank 1 is itself a replacement still joining"),
    "one peer of three still holds the state while another replacement joins: replaced":
        (FaultKind.SIGNALLED, {0}, {0: GONE, 1: JOINING, 2: UP}, 5, 3, None),
    "a peer on another node holds the state while this node's replacement joins: replaced":
        (FaultKind.SIGNALLED, {0}, {0: GONE, 1: JOINING}, 5, 4, None),
    "a peer that has ended its script cannot give the state":
        (FaultKind.SIGNALLED, {1}, {0: DONE, 1: GONE, 2: UP}, 5, 3, "rank 0 has already exited"),
    "two ranks gone in the same operation and one left: both replaced from it":
        (FaultKind.SIGNALLED, {1, 2}, {0: UP, 1: GONE, 2: GONE}, 5, 3, None),
    "a peer outside StepLoop":
        (FaultKind.SIGNALLED, {1}, {0: Member(alive=True, step_loop=False), 1: GONE}, 5, 2,
         "rank 0 does not run its loop in rankguard.StepLoop"),
    "a peer whose StepLoop has ended (its run() returned) is not said never to have run one":
        (FaultKind.EXITED, {1}, {0: Member(alive=True, step_loop=False, loop_ended=True),
                                 1: GONE}, 5, 2, "rank 0 has left its rankguard.StepLoop"),
    "a culprit whose script ended with code 0":
        (FaultKind.EXITED, {1}, {0: UP, 1: Member(alive=False, ended_well=True)}, 5, 2,
         "the rank ended its script"),
    "every rank is a culprit and no restarts are left: the state is the reason, not restarts":
        (FaultKind.HUNG, {0, 1}, {0: UP, 1: UP}, 0, 2, "no other rank holds the state"),
    "no restarts left at all":
        (FaultKind.SIGNALLED, {1}, {0: UP, 1: GONE}, 0, 2, "no restarts left"),
    "two culprits but one restart left: says that one is left (the attempt still restarts)":
        (FaultKind.HUNG, {1, 2}, {0: UP, 1: UP, 2: UP}, 1, 3,
         "2 ranks to replace but 1 restart left"),
    "a usage error: a replacement would make the script's mistake again":
        (FaultKind.USAGE_ERROR, {1}, {0: UP, 1: GONE}, 5, 2, "a usage error is the script's own"),
    "a replacement that did not join in time":
        (FaultKind.REPLACE_FAILED, {1}, {0: UP, 1: JOINING}, 5, 2, "not replaced again"),
    "a culprit on another node":
        (FaultKind.SIGNALLED, {3}, {0: UP, 1: UP}, 5, 4, "rank 3 runs on another node"),
}


@pytest.mark.parametrize("row", ROWS)
def test_refusal(row: str) -> None:
    kind, culprits, members, left, world, expected = ROWS[row]
    reason = refusal(kind, frozenset(culprits), members, left, world)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason, reason


CULPRITS: dict[str, tuple[set[int], dict[int, Member], set[int]]] = {
    "the rank the fault names":
        ({1}, {0: UP, 1: GONE}, {1}),
    "a rank reaped with it (killed in the same operation) is replaced with it":
        ({1}, {0: UP, 1: GONE, 2: GONE}, {1, 2}),
    "a rank that ended its script (or was stopped after it) is not":
        ({1}, {0: DONE, 1: GONE, 2: UP}, {1}),
    "a replacement still joining is not: its own fault repairs it":
        ({1}, {0: UP, 1: GONE, 2: Member(alive=False, joining=True)}, {1}),
    "a live rank is not, whatever its ledger says":
        ({1}, {0: Member(alive=True, step_loop=False), 1: GONE}, {1}),
    "a fault that names no rank gains none":
        (set(), {0: UP, 1: GONE}, set()),
}


@pytest.mark.parametrize("row", CULPRITS)
def test_culprits(row: str) -> None:
    named, members, expected = CULPRITS[row]
    assert culprits(frozenset(named), members) == expected
