"""Performing faults: every fault given for a moment happens there, in the order given."""

import pytest

from rankguard.inject.perform import Injector
from rankguard.inject.spec import InjectedFault, parse


def test_two_faults_at_the_same_collective_are_both_performed_in_order():
    # slow returns, then raise acts: neither may silently replace the other
    injector = Injector([parse("slow:0.01:rank=1,at=op3"), parse("raise:rank=1,at=op3")],
                        rank=1, attempt=0)
    injector.before_op(2)  # nothing at op2
    with pytest.raises(InjectedFault, match="raise:rank=1,at=op3"):
        injector.before_op(3)
    first = Injector([parse("raise:rank=1,at=op3"), parse("slow:0.01:rank=1,at=op3")],
                     rank=1, attempt=0)
    with pytest.raises(InjectedFault):
        first.before_op(3)


def test_a_step_fault_is_performed_once_before_its_step():
    # a step run again after a recovery must not fault again
    injector = Injector([parse("raise:rank=1,at=step4")], rank=1, attempt=0)
    injector.before_step(3)
    with pytest.raises(InjectedFault, match="at=step4"):
        injector.before_step(4)
    injector.before_step(4)


def test_a_fault_is_recorded_in_the_ledger_by_its_place_before_it_is_performed(tmp_path):
    # a fault that kills the rank cannot record afterwards: the record comes first
    from rankguard.records import ledger

    path = str(tmp_path / "r1.ledger")
    ledger.create(path, world_size=2)
    specs = [parse("raise:rank=0,at=step1"), parse("slow:0.01:rank=1,at=step2"),
             parse("raise:rank=1,at=step3"), parse("raise:rank=1,at=step9")]
    injector = Injector(specs, rank=1, attempt=0, ledger=ledger.LedgerWriter(path))
    reader = ledger.LedgerReader(path)
    for step in (0, 1, 2):
        injector.before_step(step)
    assert (reader.injections().fired, reader.injections().step) == ({1}, 2)
    with pytest.raises(InjectedFault):
        injector.before_step(3)
    assert (reader.injections().fired, reader.injections().step) == ({1, 2}, 3)
