"""Which of the signals whose handlers Python runs together came first.

Python runs the handlers of the signals that arrived while its main thread was inside C (an
import, a blocking call) together, in the order of their numbers: SIGINT's before SIGTERM's,
whatever the order they came in. The launcher's exit code and root cause are the first
signal's, so its handlers ask :class:`Arrivals`: Python's C-level handler writes each signal's
number to the wakeup fd (``signal.set_wakeup_fd``) as it arrives, in that order.

The same pipe wakes the launcher's event loop, which reads it too: every reader goes through
:meth:`Arrivals.read`, which keeps the first signal it read, so that a signal whose byte the
loop consumed before the handlers ran is still known to have come first (SIGHUP then SIGTERM
sent back to back: the loop woke on SIGHUP's byte, SIGTERM's came, then both handlers ran).
Two signals sent within a few milliseconds, before the process ran again, have no order to
keep: the kernel gives the second to another thread (the first is pending on the main one),
and that thread's C-level handler may write first.
"""

from __future__ import annotations

import os
from collections.abc import Collection


class Arrivals:
    """Which of the signals of ``handled`` arrived first, from the read end of the wakeup fd's
    pipe (non-blocking). Never blocks."""

    def __init__(self, wakeup_r: int, handled: Collection[int]) -> None:
        self._wakeup_r = wakeup_r
        self._handled = frozenset(int(sig) for sig in handled)
        self._first: int | None = None  # the later ones' order is of no use

    def read(self) -> None:
        """Consume what waits in the pipe (its wakes too: the pipe only wakes its reader),
        keeping the first handled signal's number."""
        while True:
            try:
                waiting = os.read(self._wakeup_r, 4096)
            except OSError:  # BlockingIOError: nothing (more) waits
                return
            if not waiting:
                return
            if self._first is None:
                self._first = next((n for n in waiting if n in self._handled), None)

    def first(self, signum: int) -> int:
        """The first handled signal to arrive so far, else ``signum`` (the signal whose handler
        runs, when its byte was not seen: a pipe full or read by someone else)."""
        self.read()
        return signum if self._first is None else self._first
