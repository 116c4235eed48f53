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
    # a real gloo work of one rank: torch's Work API as work_error reads it (gloo's work has
    # no result future and its group no get_error: nothing tells, nothing is refused)
    import torch
    import torch.distributed as dist

    from rankguard.runtime.nccl_checked import work_error

    store = dist.FileStore(str(tmp_path / "store"), 1)
    group = dist.ProcessGroupGloo(store, 0, 1)
    work = group.allreduce([torch.ones(2)])
    work.wait()
    assert work_error(work, group) is None


def _result(value: int | None):
    """A work's result future as torch's NCCL group gives it: done with a WorkResult, or not
    yet marked (None)."""
    import torch

    future = torch.futures.Future()
    if value is not None:
        future.set_result(value)
    return future


class _NcclWork:
    """What ``work_error`` reads of torch 2.11's NCCL work (a GPU's; none exists here)."""

    def __init__(self, result: int | None) -> None:
        self._result = result

    def is_completed(self) -> bool:
        return True

    def get_future_result(self):
        return _result(self._result)


class _NcclGroup:
    def __init__(self, error: int) -> None:
        self._error = error

    def get_error(self) -> int:
        return self._error


WORK_RESULTS = {  # torch's WorkResult (SUCCESS 0, TIMEOUT 1, COMM_ERROR 2) and ErrorType
    "a success": (0, 0, False),
    "a communication error": (2, 0, True),
    "a result not yet marked, the group's error set by the watchdog": (None, 3, True),
    "a result not yet marked, no error": (None, 0, False),
}


@pytest.mark.parametrize(("result", "group_error", "refused"), WORK_RESULTS.values(),
                         ids=WORK_RESULTS.keys())
def test_a_failed_nccl_work_is_told_from_its_result_or_its_groups_error(
        result: int | None, group_error: int, refused: bool) -> None:
    from rankguard.runtime.nccl_checked import UNNAMED_ERROR, work_error

    error = work_error(_NcclWork(result), _NcclGroup(group_error))
    assert error == (UNNAMED_ERROR if refused else None)
    if refused:
        assert is_nccl_failure(RuntimeError(error))


def test_a_refused_bucket_fails_the_future_ddp_waits_on_with_the_words_and_a_good_one_passes(
        ) -> None:
    # real torch futures, chained as the checker hands them to DDP
    import torch

    from rankguard.runtime.nccl_checked import _handed_on, _Refused

    inner = torch.futures.Future()
    handed = inner.then(_handed_on)
    inner.set_result(_Refused("NCCL communicator was aborted on rank 0 (a notice)"))
    with pytest.raises(RuntimeError, match="NCCL communicator was aborted on rank 0"):
        handed.wait()
    inner = torch.futures.Future()
    handed = inner.then(_handed_on)
    inner.set_result(torch.ones(3))
    assert torch.equal(handed.wait(), torch.ones(3))
