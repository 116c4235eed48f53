"""What made a collective fail, decided from gloo's or NCCL's error text and what the rank knows:
pure functions, no I/O, tested as tables (``tests/runtime/test_failures.py``).

gloo reports every failure as a ``RuntimeError`` whose text is the only thing that tells them
apart: its failures carry its source path (``[../third_party/gloo/.../pair.cc:598] Connection
closed by peer``), and its timeouts say "Timed out". These rules are the one place that reads
that text; ``bounded.explain`` turns their answer into the error the user sees.
"""

from __future__ import annotations

import enum
from typing import Any, Mapping

_GLOO_SOURCE = "third_party/gloo"  # in every message gloo raises, before its source file
_TIMED_OUT = "timed out"  # gloo's timeout message (any case), and our own TimeoutError's
# what torch's NCCL groups raise once a peer is gone: a communicator aborted (by rankguard on the
# supervisor's notice, or by torch), or NCCL's remote and system errors (a peer that exited, a
# closed socket); not NCCL's refusals of bad arguments or usage (ncclInvalidArgument, ...)
_NCCL_FAILURES = ("NCCL communicator was aborted", "ncclRemoteError", "ncclSystemError",
                  "remote process exited")
_MAX_SUMMARY = 160  # characters of gloo's first line kept in an error message


class Cause(enum.Enum):
    """Why a collective failed, in the order the rules try them."""

    SUPERVISOR_NOTICE = "the supervisor reported a peer's fault"
    PEER_NOTICE = "a peer reported that the group failed"
    DEADLINE = "the operation passed its deadline"
    PEER_FAILED = "a peer failed (gloo lost a connection)"


def is_gloo_failure(error: BaseException) -> bool:
    """Whether ``error`` is gloo's report of a failed connection (a peer that died or closed
    it), which a send raises at once, rather than a refusal of bad arguments."""
    return isinstance(error, RuntimeError) and _GLOO_SOURCE in str(error)


def is_nccl_failure(error: BaseException) -> bool:
    """Whether ``error`` is torch's report that an NCCL group failed because a peer did (its
    communicator aborted, NCCL's remote or system error: torch's ``DistBackendError``, a
    ``RuntimeError``), rather than a refusal of bad arguments. Seen on an H100: a DDP backward
    whose bucket all-reduce was enqueued after the supervisor's notice had the communicator
    aborted raised "NCCL communicator was aborted on rank 0"."""
    return isinstance(error, RuntimeError) and any(text in str(error) for text in _NCCL_FAILURES)


def is_backend_failure(error: BaseException) -> bool:
    """Whether ``error`` is gloo's or NCCL's report that a peer failed
    (:func:`is_gloo_failure`, :func:`is_nccl_failure`)."""
    return is_gloo_failure(error) or is_nccl_failure(error)


def cause(error_text: str, deadline_passed: bool, reported: Mapping[str, Any] | None) -> Cause:
    """Why the collective failed: a notice that told this rank of the failure (``reported``:
    the supervisor's, with ``"supervisor": True``, or a peer's) comes first; then a timeout
    (gloo's text says it timed out, or our deadline has passed); else a peer failed.

    ``error_text``: the failure's text ("" when there is none, as when a notice woke the wait).
    """
    if reported is not None:
        return Cause.SUPERVISOR_NOTICE if reported.get("supervisor") else Cause.PEER_NOTICE
    if _TIMED_OUT in error_text.lower() or deadline_passed:
        return Cause.DEADLINE
    return Cause.PEER_FAILED


def summary(error_text: str) -> str:
    """The first line of gloo's message, without its source path prefix, cut to
    ``_MAX_SUMMARY`` characters."""
    first = error_text.splitlines()[0] if error_text else ""
    if first.startswith("[") and "] " in first:
        first = first.split("] ", 1)[1]
    return first if len(first) <= _MAX_SUMMARY else first[:_MAX_SUMMARY - 3] + "..."
