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
