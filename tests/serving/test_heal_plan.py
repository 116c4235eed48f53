"""What a pool does with a replica after a failed request (``serving.heal_plan``), as a table."""

from __future__ import annotations

import pytest

from rankguard.errors import RequestCause, RequestFailed
from rankguard.serving.heal_plan import (STICKY_CUDA_ERRORS, Heal, HealPlan, context_lost,
                                         heal, idle_heal, out_of_memory, stopped_heal)

OOM = ("OutOfMemoryError", "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
ILLEGAL = ("AcceleratorError", "AcceleratorError: CUDA error: an illegal memory access was "
           "encountered\nCUDA kernel errors might be asynchronously reported")
ASSERT = ("RuntimeError", "RuntimeError: CUDA error: device-side assert triggered")
PLAIN = ("ValueError", "ValueError: bad prompt")


def raised(error: tuple[str, str], rank: int = 1) -> RequestFailed:
    return RequestFailed(rank, RequestCause.RAISED, error[1], error_type=error[0])


NONE: frozenset[int] = frozenset()
R1 = frozenset({1})


def hang(cause: RequestCause, rank: int | None, victims: list[int]) -> RequestFailed:
    return RequestFailed(rank, cause, "never reached all_reduce #3", victims=victims)


# fault, world, dead ranks -> the action and the ranks replaced
HEALS = {
    "a rank that raised an ordinary error leaves every process usable: regroup in place":
        (raised(PLAIN), 2, NONE, Heal.REGROUP, NONE),
    "a CUDA out-of-memory error: only that rank is replaced (its reserved memory goes back)":
        (raised(OOM), 2, NONE, Heal.REPLACE, R1),
    "an illegal memory access loses the rank's CUDA context: only that rank is replaced":
        (raised(ILLEGAL), 2, NONE, Heal.REPLACE, R1),
    "a device-side assert loses the rank's CUDA context: only that rank is replaced":
        (raised(ASSERT), 4, NONE, Heal.REPLACE, R1),
    "a rank that raised while a peer's process is gone: the dead peer is replaced":
        (raised(PLAIN), 3, frozenset({2}), Heal.REPLACE, frozenset({2})),
    "a sticky error on a one-rank replica leaves nothing to keep: kill":
        (raised(ILLEGAL, rank=0), 1, NONE, Heal.KILL, frozenset({0})),
    "a call that overran its own deadline with no rank to blame is drained, then regrouped":
        (RequestFailed(None, RequestCause.DEADLINE, "ran past its deadline"), 2, NONE,
         Heal.DRAIN_THEN_REGROUP, NONE),
    "a call whose caller was interrupted mid-call is drained too: its ranks may be healthy":
        (RequestFailed(None, RequestCause.DEADLINE, "was interrupted in the leader"), 2, NONE,
         Heal.DRAIN_THEN_REGROUP, NONE),
    "an overrun during which a rank died: the dead rank is replaced":
        (RequestFailed(None, RequestCause.DEADLINE, "ran past its deadline"), 2, R1,
         Heal.REPLACE, R1),
    "a rank blamed at the deadline is replaced after its stacks; its victim is kept":
        (hang(RequestCause.DEADLINE, 1, [0]), 2, NONE, Heal.STACKS_THEN_REPLACE, R1),
    "a stopped rank is replaced after its stacks; its victims are kept":
        (hang(RequestCause.FROZEN, 1, [0, 2]), 3, NONE, Heal.STACKS_THEN_REPLACE, R1),
    "a rank that is neither the culprit nor a victim was still running: replaced too":
        (hang(RequestCause.FROZEN, 1, [0]), 3, NONE, Heal.STACKS_THEN_REPLACE,
         frozenset({1, 2})),
    "a hang whose culprits are every rank leaves nothing to keep: stacks, then kill":
        (hang(RequestCause.DEADLINE, 0, []), 2, NONE, Heal.STACKS_THEN_KILL,
         frozenset({0, 1})),
    "a rank that exited is replaced; its peers are kept":
        (RequestFailed(1, RequestCause.EXITED, "exited with code 3"), 2, R1,
         Heal.REPLACE, R1),
    "a rank killed by a signal is replaced; its peers are kept":
        (RequestFailed(2, RequestCause.SIGNALLED, "was killed by SIGKILL"), 4, frozenset({2}),
         Heal.REPLACE, frozenset({2})),
    "every rank dead: kill":
        (RequestFailed(0, RequestCause.SIGNALLED, "was killed by SIGKILL"), 2,
         frozenset({0, 1}), Heal.KILL, frozenset({0, 1})),
    "a dead rank the verdict does not name (it died after the culprit) is replaced too":
        (RequestFailed(0, RequestCause.EXITED, "exited with code 1"), 3, frozenset({0, 2}),
         Heal.REPLACE, frozenset({0, 2})),
}


@pytest.mark.parametrize("case", HEALS.values(), ids=HEALS.keys())
def test_heal(case: tuple[RequestFailed, int, frozenset[int], Heal, frozenset[int]]) -> None:
    fault, world, dead, action, replaced = case
    assert heal(fault, world, dead) == HealPlan(action, replaced)


IDLE = {  # (world, dead or stopped ranks) -> plan
    "an idle replica that lost a rank has it replaced": (idle_heal, 3, R1, Heal.REPLACE, R1),
    "an idle replica that lost every rank is killed": (idle_heal, 2, frozenset({0, 1}),
                                                       Heal.KILL, frozenset({0, 1})),
    "a rank found stopped as its replica healed is replaced after its stacks":
        (stopped_heal, 2, R1, Heal.STACKS_THEN_REPLACE, R1),
    "every rank found stopped: stacks, then kill":
        (stopped_heal, 2, frozenset({0, 1}), Heal.STACKS_THEN_KILL, frozenset({0, 1})),
}


@pytest.mark.parametrize("case", IDLE.values(), ids=IDLE.keys())
def test_idle_and_stopped_heals(case: tuple) -> None:
    decide, world, ranks, action, replaced = case
    assert decide(world, ranks) == HealPlan(action, replaced)


@pytest.mark.parametrize("sticky", STICKY_CUDA_ERRORS)
def test_every_sticky_cuda_error_is_recognised_in_torchs_wording(sticky: str) -> None:
    assert context_lost("AcceleratorError", f"AcceleratorError: CUDA error: {sticky}\n")


def test_an_error_that_is_not_an_exception_of_the_rank_is_never_a_lost_context() -> None:
    assert not context_lost(None, "CUDA error: an illegal memory access was encountered")
    assert not context_lost(*OOM)


@pytest.mark.parametrize("error, expected", [
    (OOM, True),
    (("RuntimeError", "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB"), True),
    (("RuntimeError", "RuntimeError: DefaultCPUAllocator: can't allocate memory"), False),
    (PLAIN, False),
    (ASSERT, False),
    ((None, "CUDA out of memory"), False),  # not an exception of the rank
])
def test_cuda_out_of_memory_is_recognised(error: tuple, expected: bool) -> None:
    assert out_of_memory(*error) is expected
