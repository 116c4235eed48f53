"""The deadline in force for a collective: ``with rankguard.deadline(seconds): ...`` blocks
and the job-wide default.

A deadline is an absolute point on the monotonic clock, set once at the edge (the ``with``
statement, or the job-wide default when an operation starts) and read by every layer below, never
re-derived. Nested deadlines keep the earliest. The effective deadline of an operation is the
earliest of the innermost ``deadline()`` block of the calling thread and ``now + default``, where
the job-wide default is set by ``rankguard.init(collective_timeout=...)`` or by the launcher's
``--collective-timeout``.

The instrumented process group hands the remaining time to gloo as the operation's own timeout,
so the bound holds for collectives issued from C++ (DistributedDataParallel) too; see
``runtime.bounded`` for what happens when it passes.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from ..deadline import Deadline, check_seconds
from .state import current as _rank_state

__all__ = ["Deadline", "check_seconds", "current", "deadline", "default", "set_default", "until"]


class _Scope(threading.local):
    innermost: Deadline | None = None


_scope = _Scope()
_default_seconds: float | None = None
# the main thread's innermost block, for the thread that bounds NCCL groups (async_groups)
_main_innermost: Deadline | None = None


def set_default(seconds: float | None) -> None:
    """Set (or clear, with None) the job-wide deadline of every collective."""
    global _default_seconds
    _default_seconds = (None if seconds is None
                        else check_seconds("collective_timeout", seconds, text=False))
    if _default_seconds is not None:
        _rank_state().record_only = False


def default() -> float | None:
    """The job-wide deadline of every collective, in seconds, or None."""
    return _default_seconds


def deadline(seconds: float) -> contextlib.AbstractContextManager[Deadline]:
    """Bound every collective issued by this thread inside the block to ``seconds`` from now.

    A collective that has not completed when the deadline passes raises
    :class:`rankguard.CollectiveTimeout` (naming the operation, its sequence number and the ranks
    that had not arrived) and retires its process group. Nested blocks keep the earliest
    deadline. Needs the process group to be created under ``rankguard run``, or after
    ``rankguard.init()``. The ranks that had not arrived are named only in bounded mode (after
    ``rankguard.init()``, or ``rankguard run --collective-timeout``): elsewhere the collective
    is bounded all the same, but its error names none, and the launcher blames the rank that
    raised.

    Raises:
        UsageError: ``seconds`` is not a positive number.
    """
    return until(Deadline.after(check_seconds("rankguard.deadline(seconds)", seconds,
                                              text=False)))


@contextlib.contextmanager
def until(limit: Deadline) -> Iterator[Deadline]:
    """:func:`deadline` for a deadline already made (a caller's, perhaps in another process):
    bound every collective of this thread inside the block by ``limit``, or by an enclosing
    block's deadline if that one is earlier. Yields the deadline in force."""
    global _main_innermost
    _rank_state().record_only = False
    outer = _scope.innermost
    limit = limit.sooner(outer)
    _scope.innermost = limit
    main = threading.current_thread() is threading.main_thread()
    if main:
        _main_innermost = limit
    try:
        yield limit
    finally:
        _scope.innermost = outer
        if main:
            _main_innermost = outer


def main_thread_limit() -> Deadline | None:
    """The innermost ``deadline()`` block the main thread is in, read from any thread (None:
    none): what bounds the collectives of groups rankguard does not wrap (NCCL's), whose
    operations the main thread only enqueues."""
    return _main_innermost


def current() -> Deadline | None:
    """The deadline an operation starting now must meet, or None for no deadline."""
    scoped = _scope.innermost
    if _default_seconds is None:
        return scoped
    job = Deadline.after(_default_seconds)
    return scoped if scoped is not None and scoped.at <= job.at else job
