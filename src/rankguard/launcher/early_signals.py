"""The launcher's signals before its agent takes them over: while it imports, parses its flags
and joins the other nodes' store, no rank has started, and a signal must end it at once with
its exit code (128 + the signal), one line, and no empty log folder.

:func:`hold` points torchrun's default signals (SIGTERM, SIGINT, SIGHUP, SIGQUIT) at a handler
that only records the first one: a handler that raised (Python's default for SIGINT) would do
so inside whatever runs, a C++ store call included, which then aborts the process. The waits
of that phase call :func:`check`, which raises :class:`Interrupted` once one came; the agent
takes a signal still pending as its first (``Agent``), so none is lost in between. A signal
the process ignores (``nohup``'s SIGHUP) stays ignored.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from . import signal_order

HELD = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

_pending: int | None = None


class Interrupted(Exception):
    """A signal came before the agent took the signals over; ``signum`` is it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted ({signal.Signals(signum).name}) before the job started")


_arrivals: signal_order.Arrivals | None = None  # from the wakeup fd's pipe, while held


def _record(signum: int, _frame: Any) -> None:
    global _pending
    if _pending is None:
        _pending = signum if _arrivals is None else _arrivals.first(signum)


def hold() -> None:
    """Record, rather than act on, each of :data:`HELD` not ignored here (the first to arrive).
    Main thread only."""
    global _arrivals
    if _arrivals is None:
        wakeup = os.pipe()
        for end in wakeup:
            os.set_blocking(end, False)
        signal.set_wakeup_fd(wakeup[1], warn_on_full_buffer=False)
        _arrivals = signal_order.Arrivals(wakeup[0], HELD)
    for sig in HELD:
        if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(sig, _record)


def release(kept: tuple[int, ...]) -> None:
    """Give back each held signal not in ``kept`` (the ones the agent handles) its default
    disposition."""
    for sig in HELD:
        if sig not in kept and signal.getsignal(sig) is _record:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                          else signal.SIG_DFL)


def pending() -> int | None:
    """The first signal that came while held, if any."""
    return _pending


def check() -> None:
    """Raise :class:`Interrupted` if a held signal came."""
    if _pending is not None:
        raise Interrupted(_pending)
