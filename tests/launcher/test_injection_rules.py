"""Which ``--inject`` specs never fired, and what the run says of them: table-driven over the
ledgers' injection records (no processes; milliseconds). The runs that prove it on real ranks
are in test_injections.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rankguard.inject.spec import parse
from rankguard.launcher.injections import Seen, never_fired
from rankguard.records.ledger import InjectionProgress


def _seen(attempt: int, rank: int, fired: tuple[int, ...] = (), step: int | None = None,
          op: int = 0, bootstrapped: bool = True) -> Seen:
    return Seen(attempt, rank, InjectionProgress(frozenset(fired), step, op, bootstrapped))


@dataclass
class Case:
    specs: list[str]
    seen: list[Seen]
    said: list[str]  # the messages, in the specs' order
    attempts: list[int | None] | None = None  # the attempt each names, when the case checks it


CASES = {
    "a step fault in a script without StepLoop never fired, at its rank's last op": Case(
        ["kill:rank=0,at=step5"], [_seen(0, 0, op=3), _seen(0, 1, op=3)],
        ["injection kill:rank=0,at=step5 never fired (in attempt 0, rank 0 reached op 3 and no "
         "rankguard.StepLoop step)"], [0]),
    "a step past the loop's last step never fired, at its last step": Case(
        ["kill:rank=1,at=step20"], [_seen(0, 0, op=40, step=None), _seen(0, 1, op=40, step=19)],
        ["injection kill:rank=1,at=step20 never fired (in attempt 0, rank 1 reached op 40 and "
         "step 19)"]),
    "a fault that fired is not reported": Case(
        ["kill:rank=1,at=op5"], [_seen(0, 0, op=5), _seen(0, 1, fired=(0,), op=5)], []),
    "a fault fired by the first process of a replaced rank is not reported": Case(
        ["kill:rank=1,at=step3"],
        [_seen(0, 1, fired=(0,), step=3, op=7), _seen(0, 1, step=None, op=30)], []),
    "each spec is judged by its own place, not by another fault of the same rank": Case(
        ["crash:rank=1,at=op5", "hang:rank=1,at=op50"],
        [_seen(0, 1, fired=(0,), op=5), _seen(1, 1, op=60)],
        ["injection hang:rank=1,at=op50 never fired (in attempt 0, rank 1 reached op 5)"]),
    "a fault of an attempt that never ran says so": Case(
        ["crash:rank=0,at=op5,attempt=1"], [_seen(0, 0, op=20)],
        ["injection crash:rank=0,at=op5,attempt=1 never fired (the run ended after attempt 0)"],
        [None]),
    "a fault of every attempt that fired in one is not reported": Case(
        ["crash:rank=0,at=op5,attempt=any"],
        [_seen(0, 0, fired=(0,), op=5), _seen(1, 0, op=5, fired=(0,)), _seen(2, 0, op=2)], []),
    "a fault of every attempt that fired in none tells the last attempt": Case(
        ["crash:rank=0,at=op50,attempt=any"], [_seen(0, 0, op=20), _seen(1, 0, op=21)],
        ["injection crash:rank=0,at=op50,attempt=any never fired (in attempt 1, rank 0 reached "
         "op 21)"], [1]),
    "a rank that never ran rankguard's bootstrap is not said to have reached anything": Case(
        ["kill:rank=0,at=init"], [_seen(0, 0, bootstrapped=False)],
        ["injection kill:rank=0,at=init never fired (in attempt 0, rank 0 recorded nothing: how "
         "far it got is not known)"]),
    "a rank that issued nothing reached no collective": Case(
        ["hang:rank=0,at=op1"], [_seen(0, 0)],
        ["injection hang:rank=0,at=op1 never fired (in attempt 0, rank 0 reached no "
         "collective)"]),
    "a rank of another node is that node's agent's to report": Case(
        ["kill:rank=3,at=step5"], [_seen(0, 0, op=3), _seen(0, 1, op=3)], []),
    "a run without injected faults reports nothing": Case([], [_seen(0, 0, op=3)], []),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_never_fired(case: Case) -> None:
    found = never_fired([parse(text) for text in case.specs], case.seen)
    assert [f.message for f in found] == case.said
    if case.attempts is not None:
        assert [f.attempt for f in found] == case.attempts


def test_a_never_fired_spec_is_journaled_with_its_data() -> None:
    (found,) = never_fired([parse("kill:rank=1,at=step20")], [_seen(0, 1, op=40, step=19)])
    assert found.as_dict() == {"injection": "kill:rank=1,at=step20", "rank": 1, "attempt": 0,
                               "step": 19, "op": 40, "message": found.message}
