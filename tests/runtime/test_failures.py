"""What made a collective fail (``runtime.failures``), from gloo's text and what the rank
knows, case by case: pure rules over the texts gloo raises."""

from __future__ import annotations

from typing import Any

import pytest

from rankguard.runtime.failures import (Cause, cause, is_backend_failure, is_gloo_failure,
                                        is_nccl_failure, summary)
from rankguard.runtime.step_loop import peer_fault

CLOSED = ("[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer "
          "[127.0.0.1]:5000")
GLOO_TIMEOUT = ("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                "waiting 1000ms for recv operation to complete")
SUPERVISOR = {"supervisor": True, "kind": "hung", "rank": 2}
PEER = {"by": 1, "op": "all_reduce", "seq": 57}

CAUSES: dict[str, tuple[str, bool, dict[str, Any] | None, Cause]] = {
    "the supervisor's notice wins over gloo's timeout and a passed deadline":
        (GLOO_TIMEOUT, True, SUPERVISOR, Cause.SUPERVISOR_NOTICE),
    "a peer's notice wins over a closed connection": (CLOSED, False, PEER, Cause.PEER_NOTICE),
    "a notice that woke the wait, with no error text": ("", False, PEER, Cause.PEER_NOTICE),
    "gloo says it timed out, before our deadline": (GLOO_TIMEOUT, False, None, Cause.DEADLINE),
    "our own TimeoutError's text": ("timed out", False, None, Cause.DEADLINE),
    "the deadline passed before gloo said anything": ("", True, None, Cause.DEADLINE),
    "the deadline passed while a connection closed": (CLOSED, True, None, Cause.DEADLINE),
    "a connection closed before the deadline": (CLOSED, False, None, Cause.PEER_FAILED),
    "a reset with no gloo source path": ("Connection reset by peer", False, None,
                                         Cause.PEER_FAILED),
    "no text, no deadline passed, no notice": ("", False, None, Cause.PEER_FAILED),
}


@pytest.mark.parametrize(("text", "passed", "reported", "expected"), CAUSES.values(),
                         ids=CAUSES.keys())
def test_the_cause_of_a_failed_collective(text: str, passed: bool,
                                          reported: dict[str, Any] | None,
                                          expected: Cause) -> None:
    assert cause(text, passed, reported) is expected


GLOO_FAILURES: dict[str, tuple[BaseException, bool]] = {
    "gloo's closed connection": (RuntimeError(CLOSED), True),
    "gloo's timeout": (RuntimeError(GLOO_TIMEOUT), True),
    "torch refusing bad arguments": (RuntimeError("ProcessGroupGloo::broadcast: invalid root "
                                                  "rank: 5"), False),
    "gloo's text in an error that is not a RuntimeError": (ValueError(CLOSED), False),
    "a RuntimeError of the user's": (RuntimeError("loss is NaN"), False),
}


@pytest.mark.parametrize(("error", "expected"), GLOO_FAILURES.values(), ids=GLOO_FAILURES.keys())
def test_whether_an_error_is_gloos_report_of_a_failed_connection(error: BaseException,
                                                                 expected: bool) -> None:
    assert is_gloo_failure(error) is expected


# torch 2.11's texts on an H100 (a DDP backward after the supervisor's notice; torch's watchdog)
NCCL_ABORTED = "NCCL communicator was aborted on rank 0. "
NCCL_REMOTE = ("NCCL error: remote process exited or there was a network error, NCCL version "
               "2.28.9\nncclRemoteError: A call failed possibly due to a network error or a "
               "remote process exiting prematurely.")
NCCL_FAILURES: dict[str, tuple[BaseException, bool]] = {
    "a communicator aborted": (RuntimeError(NCCL_ABORTED), True),
    "NCCL's remote error": (RuntimeError(NCCL_REMOTE), True),
    "NCCL refusing bad arguments": (RuntimeError("NCCL error: invalid argument (run with "
                                                 "NCCL_DEBUG=WARN for details), NCCL version "
                                                 "2.28.9\nncclInvalidArgument: Invalid value "
                                                 "for an argument."), False),
    "NCCL's text in an error that is not a RuntimeError": (ValueError(NCCL_ABORTED), False),
    "a RuntimeError of the user's": (RuntimeError("CUDA out of memory"), False),
}


@pytest.mark.parametrize(("error", "expected"), NCCL_FAILURES.values(), ids=NCCL_FAILURES.keys())
def test_whether_an_error_is_nccls_report_of_a_lost_peer(error: BaseException,
                                                         expected: bool) -> None:
    assert is_nccl_failure(error) is expected
    assert is_backend_failure(error) is expected


def test_a_step_that_raised_nccls_aborted_communicator_is_a_peers_fault_the_loop_recovers_from(
        ) -> None:
    try:
        try:
            raise RuntimeError(NCCL_ABORTED)
        except RuntimeError as backward:
            raise KeyError("the user's wrapper") from backward
    except KeyError as step_error:
        assert str(peer_fault(step_error)) == NCCL_ABORTED
    assert peer_fault(RuntimeError("CUDA out of memory")) is None


SUMMARIES = {
    "gloo's source path is taken off": (CLOSED, "Connection closed by peer [127.0.0.1]:5000"),
    "a text without a source path stays": ("Connection reset by peer",
                                           "Connection reset by peer"),
    "only the first line is kept": ("Timed out\nmore", "Timed out"),
    "a long line is cut to 160 characters": ("x" * 400, "x" * 157 + "..."),
    "a line of exactly 160 characters stays whole": ("y" * 160, "y" * 160),
    "no text": ("", ""),
}


@pytest.mark.parametrize(("text", "expected"), SUMMARIES.values(), ids=SUMMARIES.keys())
def test_the_summary_of_gloos_message(text: str, expected: str) -> None:
    assert summary(text) == expected
