"""When a DDP bucket's NCCL all-reduce may be used (``runtime.nccl_checked.refusal``, pure);
the thread that waits for the GPU runs only on one (tests/gpu/test_nccl_in_place.py)."""

from __future__ import annotations

import pytest

from rankguard.runtime.failures import is_nccl_failure
from rankguard.runtime.nccl_checked import refusal

REMOTE = ("NCCL error: remote process exited or there was a network error, NCCL version "
          "2.28.9\nncclRemoteError: A call failed possibly due to a network error or a remote "
          "process exiting prematurely.")

CASES = {
    "it ended well": (None, None, None),
    "the communicator reported NCCL's remote error": (REMOTE, None, REMOTE),
    "rankguard aborted the communicator (no work is marked failed)": (
        None, "the supervisor reported that rank 1 died",
        "NCCL communicator was aborted on rank 0 (the supervisor reported that rank 1 died): a "
        "collective it ran is unusable"),
    "both: the abort is said first": (
        REMOTE, "its NCCL communicator was aborted",
        "NCCL communicator was aborted on rank 0 (its NCCL communicator was aborted): a "
        "collective it ran is unusable"),
}


@pytest.mark.parametrize(("work_error", "aborted", "expected"), CASES.values(), ids=CASES.keys())
def test_an_all_reduce_is_refused_when_its_communicator_failed_or_was_aborted(
        work_error: str | None, aborted: str | None, expected: str | None) -> None:
    why = refusal(work_error, aborted, rank=0)
    assert why == expected
    if why is not None:  # StepLoop takes the error DDP raises with it for a peer's fault
        assert is_nccl_failure(RuntimeError(why))
