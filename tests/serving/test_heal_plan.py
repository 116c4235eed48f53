"""What a pool does with a replica after a failed request (``serving.heal_plan``), as a table."""

from __future__ import annotations

import pytest

from rankguard.errors import RequestCause, RequestFailed
from rankguard.serving.heal_plan import STICKY_CUDA_ERRORS, Heal, context_lost, heal

OOM = ("OutOfMemoryError", "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
ILLEGAL = ("AcceleratorError", "AcceleratorError: CUDA error: an illegal memory access was "
           "encountered\nCUDA kernel errors might be asynchronously reported")
ASSERT = ("RuntimeError", "RuntimeError: CUDA error: device-side assert triggered")
PLAIN = ("ValueError", "ValueError: bad prompt")


def raised(error: tuple[str, str], rank: int = 1) -> RequestFailed:
    return RequestFailed(rank, RequestCause.RAISED, error[1], error_type=error[0])


HEALS = {
    "a rank that raised an ordinary error leaves every process usable: regroup in place":
        (raised(PLAIN), True, False, Heal.REGROUP),
    "a CUDA out-of-memory error is not sticky: the process is kept and regrouped":
        (raised(OOM), True, False, Heal.REGROUP),
    "an illegal memory access loses the rank's CUDA context: the replica is killed":
        (raised(ILLEGAL), True, False, Heal.KILL),
    "a device-side assert loses the rank's CUDA context: the replica is killed":
        (raised(ASSERT), True, False, Heal.KILL),
    "a rank that raised but whose peer's process is gone cannot regroup":
        (raised(PLAIN), False, False, Heal.KILL),
    "a call that overran its own deadline with no rank to blame is drained, then regrouped":
        (RequestFailed(None, RequestCause.DEADLINE, "ran past its deadline"), True, False,
         Heal.DRAIN_THEN_REGROUP),
    "an overrun while the leader was interrupted mid-call is a hang: stacks, then kill":
        (RequestFailed(None, RequestCause.DEADLINE, "ran past its deadline"), True, True,
         Heal.STACKS_THEN_KILL),
    "a rank blamed at the deadline: stacks, then kill":
        (RequestFailed(1, RequestCause.DEADLINE, "never reached all_reduce #3"), True, False,
         Heal.STACKS_THEN_KILL),
    "a stopped rank: stacks, then kill":
        (RequestFailed(1, RequestCause.FROZEN, "is stopped (SIGSTOP)"), True, False,
         Heal.STACKS_THEN_KILL),
    "a rank that exited: kill":
        (RequestFailed(1, RequestCause.EXITED, "exited with code 3"), False, False, Heal.KILL),
    "a rank killed by a signal: kill":
        (RequestFailed(1, RequestCause.SIGNALLED, "was killed by SIGKILL"), False, False,
         Heal.KILL),
}


@pytest.mark.parametrize("case", HEALS.values(), ids=HEALS.keys())
def test_heal(case: tuple[RequestFailed, bool, bool, Heal]) -> None:
    fault, all_alive, interrupted, want = case
    assert heal(fault, all_alive, interrupted) is want


@pytest.mark.parametrize("sticky", STICKY_CUDA_ERRORS)
def test_every_sticky_cuda_error_is_recognised_in_torchs_wording(sticky: str) -> None:
    assert context_lost("AcceleratorError", f"AcceleratorError: CUDA error: {sticky}\n")


def test_an_error_that_is_not_an_exception_of_the_rank_is_never_a_lost_context() -> None:
    assert not context_lost(None, "CUDA error: an illegal memory access was encountered")
    assert not context_lost(*OOM)
