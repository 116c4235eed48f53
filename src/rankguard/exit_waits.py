"""The runtime's own calls still in flight when the interpreter exits: each ends before it.

CPython ends a daemon thread that comes back into the interpreter while the interpreter
finalizes by unwinding it (``pthread_exit``). Unwound through torch's bindings (the destructor
that takes the GIL back after a store call or a connect returned), that aborts the whole
process: "terminate called without an active exception", SIGABRT, so a rank whose script ended
with 0 exits -6, which a launcher counts as a crash. It happened to a rank that ended while
telling its peers that a connect it had given up on ended late (its notice was a store call on
a helper thread).

So a thread that makes such a call, bounded by a deadline, is registered with
:func:`finish_before_exit`; an exit handler (``atexit``, run before the interpreter finalizes)
joins each until its own deadline, at most ``margins.EXIT_WAIT_CAP_S`` in all. A thread still
blocked past its deadline (a call abandoned on a stalled server, a connect gloo still runs) is
not waited for: it would come back during the finalization only where its server or peer came
back in that instant.

:func:`leave_now` ends a process whose work is done after its exit handlers (these waits
included), without the interpreter's finalization, which takes 0.6 s with torch imported on an
idle machine, and seconds on a loaded one.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

from .deadline import Deadline
from .margins import EXIT_WAIT_CAP_S

_pending: list[tuple[threading.Thread, Deadline]] = []
_lock = threading.Lock()
_handler_installed = False


def finish_before_exit(thread: threading.Thread, limit: Deadline) -> None:
    """Have the interpreter's exit wait for ``thread`` until ``limit`` (``Deadline.never()``:
    not waited for, as it may never end)."""
    global _handler_installed
    if limit.wait_time_or_none() is None:
        return
    with _lock:
        _pending[:] = [(alive, until) for alive, until in _pending
                       if alive.is_alive() and not until.passed()]
        _pending.append((thread, limit))
        if not _handler_installed:
            atexit.register(wait_for_pending)
            _handler_installed = True


def wait_for_pending(cap: float = EXIT_WAIT_CAP_S) -> list[str]:
    """Join every registered thread still running until its deadline, at most ``cap`` seconds
    in all (threads registered meanwhile too); returns the names of those left running."""
    overall = Deadline.after(cap)
    me = threading.current_thread()
    while True:
        with _lock:
            waiting = [(thread, until) for thread, until in _pending
                       if thread.is_alive() and thread is not me]
            due = [(thread, until) for thread, until in waiting if not until.passed()]
        if not due or overall.passed():
            return [thread.name for thread, _ in waiting]
        thread, until = due[0]
        thread.join(until.sooner(overall).wait_time())


def leave_now(code: int) -> NoReturn:
    """End the process with ``code`` after its exit handlers (``atexit``: the waits above, and
    the program's own), with stdout and stderr flushed, without the interpreter's finalization.
    Does not return."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
