"""Which of the signals whose handlers Python runs together came first.

Python runs the handlers of the signals that arrived while its main thread was inside C (an
import, a blocking call) together, in the order of their numbers: SIGINT's before SIGTERM's,
whatever the order they came in. The launcher's exit code and root cause are the first
signal's, so its handlers ask :func:`first_arrived`: Python's C-level handler writes each
signal's number to the wakeup fd (``signal.set_wakeup_fd``) as it arrives, in that order.
"""

from __future__ import annotations

import os
from collections.abc import Collection


def first_arrived(wakeup_r: int, handled: Collection[int], signum: int) -> int:
    """The first of ``handled`` whose number waits in ``wakeup_r`` (the read end of the wakeup
    fd's pipe, non-blocking; what is read is consumed: the pipe only wakes its reader, and the
    caller wakes it again), else ``signum``, the signal whose handler runs. Never blocks."""
    try:
        waiting = os.read(wakeup_r, 4096)
    except OSError:  # BlockingIOError: nothing waits
        return signum
    return next((number for number in waiting if number in handled), signum)
