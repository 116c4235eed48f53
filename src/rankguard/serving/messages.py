"""What the pool's leader and a rank of a replica say to each other over their channel
(``serving.channel``): dicts whose ``op`` is an :class:`Op`. ``serving.worker`` describes each
message's fields; ``serving.replica`` is the leader's side."""

from __future__ import annotations

import enum
import time
from typing import Any, Iterable

# the most characters of an error's text, or of its traceback, that a failure answer carries:
# a rank that raises with a message of megabytes must not make its answer (and the verdict
# that waits for it) megabytes long
TEXT_LIMIT = 64 * 1024


class Op(enum.StrEnum):
    """A message's kind (its ``op``)."""

    # leader -> rank
    START = "start"  # form the group, run the setup
    RUN = "run"  # run a request
    REGROUP = "regroup"  # form a fresh generation after a failed request
    EXIT = "exit"  # a bounded shutdown, then exit
    # rank -> leader
    READY = "ready"  # the setup is done
    SETUP_FAILED = "setup_failed"  # the setup raised
    ANSWER = "answer"  # a request's result or error
    REGROUPED = "regrouped"  # whether the fresh generation formed
    BYE = "bye"  # the shutdown is done


def text_of(error: BaseException) -> str:
    """``str(error)``, or what stands for it when that raises (an exception's own
    ``__str__`` is the user's code): never raises."""
    try:
        return str(error)
    except Exception as failed:  # noqa: BLE001 (whatever the user's __str__ raises)
        return f"<its str() raised {type(failed).__name__}>"


def failure(error: BaseException, *, message: str | None = None, traceback: str = "",
            collective: bool = False, missing: Iterable[int] = ()) -> dict[str, Any]:
    """The fields of a failed answer (``ok`` False) for ``error``: ``message`` defaults to
    :func:`text_of`; the texts are cut to ``TEXT_LIMIT`` characters. Never raises."""
    return {"ok": False, "error": type(error).__name__,
            "message": _cut(text_of(error) if message is None else message),
            "traceback": _cut(traceback), "collective": collective, "missing": list(missing),
            "at": time.monotonic()}


def _cut(text: str) -> str:
    if len(text) <= TEXT_LIMIT:
        return text
    return f"{text[:TEXT_LIMIT]}... ({len(text) - TEXT_LIMIT} more characters)"
