"""One call of the launcher's main thread that a signal may cut short.

The launcher's signal handlers set a flag and wake waits, and its loops act: a raise from a
handler would land wherever the main thread happens to be. One wait cannot look at a flag: the
job store's first hosting, which imports torch on the main thread (2 s, over 10 s under load),
while the first attempt's ranks start. :class:`Interruptible` lets a handler cut that call short,
and only that call: :meth:`Interruptible.cut` raises :class:`CutShort` only while
:meth:`Interruptible.run` is running its call, which catches it.

A raise can land in C code that swallows it or makes an error of its own of it (numpy's
extension, imported by torch's: its module fails with the cut, torch goes on without it, and
its next import fails with "cannot load module more than once per process"). So a cut repeats
every :data:`REPEAT_S` until the call ends, and whatever the call raises once cut is the cut's.
"""

from __future__ import annotations

import signal
from typing import Any, Callable, TypeVar

T = TypeVar("T")

REPEAT_S = 0.05  # between the raises of a cut until the call ends (SIGALRM's timer)


class CutShort(BaseException):
    """Raised inside the call being cut short. A BaseException, so that no ``except Exception``
    of the callee (torch's, around an optional import) takes it."""


class Interruptible:
    """Runs calls that :meth:`cut` may end, one at a time, on the main thread."""

    def __init__(self) -> None:
        self._running = False
        self._cut = False
        self._before_repeats: Any = None  # SIGALRM's handler while a cut repeats

    def run(self, call: Callable[[], T]) -> T | None:
        """``call()``; None if it was cut short (whatever it raised then), or if a cut came
        before (it is not started). Whatever else it raises propagates."""
        if self._cut:
            return None
        try:
            try:
                self._running = True
                return call()
            finally:
                self._running = False  # a repeat landing before this is caught below
        except CutShort:
            return None
        except BaseException:
            if self._cut:
                return None
            raise
        finally:
            self._stop_repeating()

    def cut(self) -> None:
        """From a signal handler: ends the call under way (raises inside it, then again every
        :data:`REPEAT_S` until it ends), and keeps any later one from starting. Outside a call
        it only records the cut: it never raises there."""
        self._cut = True
        if self._running:
            if self._before_repeats is None:  # a second cut: the repeats run already
                self._before_repeats = signal.signal(signal.SIGALRM, self._repeat)
                signal.setitimer(signal.ITIMER_REAL, REPEAT_S, REPEAT_S)
            raise CutShort()

    def _repeat(self, _signum: int, _frame: object) -> None:
        if self._running:
            raise CutShort()

    def _stop_repeating(self) -> None:
        if self._before_repeats is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._before_repeats)
            self._before_repeats = None
