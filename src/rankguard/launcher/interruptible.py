"""One call of the launcher's main thread that a signal may cut short.

The launcher's signal handlers set a flag and wake waits, and its loops act: a raise from a
handler would land wherever the main thread happens to be. One wait cannot look at a flag: the
job store's first hosting, which imports torch on the main thread (2 s, over 10 s under load),
while the first attempt's ranks start. :class:`Interruptible` lets a handler cut that call short,
and only that call: :meth:`Interruptible.cut` raises :class:`CutShort` only while
:meth:`Interruptible.run` is running its call, which catches it.
"""

from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


class CutShort(BaseException):
    """Raised inside the call being cut short. A BaseException, so that no ``except Exception``
    of the callee (torch's, around an optional import) takes it."""


class Interruptible:
    """Runs calls that :meth:`cut` may end, one at a time, on the main thread."""

    def __init__(self) -> None:
        self._running = False
        self._cut = False

    def run(self, call: Callable[[], T]) -> T | None:
        """``call()``; None if it was cut short, or if a cut came before (it is not started).
        Whatever else it raises propagates."""
        if self._cut:
            return None
        try:
            try:
                self._running = True
                return call()
            finally:
                self._running = False
        except CutShort:
            return None

    def cut(self) -> None:
        """From a signal handler: ends the call under way (raises inside it, once), and keeps any
        later one from starting. Outside a call it only records the cut: it never raises
        there."""
        self._cut = True
        if self._running:
            self._running = False
            raise CutShort()
