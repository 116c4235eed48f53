"""What made a collective fail, decided from gloo's error text and what the rank knows: pure
functions, no I/O, tested as tables (``tests/runtime/test_failures.py``).

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
