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


def test_a_works_error_is_read_on_the_torch_installed_here_and_a_good_work_has_none(
        tmp_path) -> None:
    # a real gloo work of one rank: torch's Work API as work_error reads it (on torch 2.11,
    # exception() raises TypeError and is_success() tells: tests/gpu's environment)
    import torch
    import torch.distributed as dist

    from rankguard.runtime.nccl_checked import work_error

    store = dist.FileStore(str(tmp_path / "store"), 1)
    group = dist.ProcessGroupGloo(store, 0, 1)
    work = group.allreduce([torch.ones(2)])
    work.wait()
    assert work_error(work) is None


class _FailedOn211:
    """A work as torch 2.11 gives it for a failed NCCL all-reduce."""

    def is_completed(self) -> bool:
        return True

    def exception(self) -> None:
        raise TypeError("Unable to convert function return value to a Python type!")

    def is_success(self) -> bool:
        return False


class _NoApi:
    def is_completed(self) -> bool:
        raise AttributeError("no such method")


def test_a_failed_work_on_torch_2_11_is_named_and_an_api_that_fails_refuses_nothing() -> None:
    from rankguard.runtime.nccl_checked import UNNAMED_ERROR, work_error

    assert work_error(_FailedOn211()) == UNNAMED_ERROR
    assert is_nccl_failure(RuntimeError(UNNAMED_ERROR))
    assert work_error(_NoApi()) is None
