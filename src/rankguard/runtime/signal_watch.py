"""The rank runtime's signals, answered by a thread of its own rather than in the signal handler.

A Python ``signal.signal`` handler runs only when the main thread returns to the interpreter,
which a rank blocked in a collective does not do; and a C-level handler that reads the
interpreter's state (``faulthandler``'s) can crash the process: on Python 3.11 and 3.12 a signal
that lands while the main thread enters a Python function from C (``tstate->cframe`` already
points at a frame record whose fields are not written yet) makes it walk a garbage frame chain,
and the rank dies of SIGSEGV (seen while ranks imported torch).

So the C-level part is CPython's own (async-signal-safe: it sets a flag and writes the signal's
number to the signal wakeup fd), and :func:`install` points that fd at a pipe read by a **watcher
thread**, which calls what :func:`on` registered for the signal with the GIL held: every thread
is then at a point where its frames are whole. A wakeup fd set before ours (an event loop's)
still gets every byte.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

from ..errors import UsageError

_callbacks: dict[int, Callable[[], None]] = {}
_installed = False


def on(signum: int, callback: Callable[[], None]) -> None:
    """Call ``callback`` from the watcher thread each time ``signum`` arrives (several arrivals
    that the watcher reads at once count as one). The caller installs a Python handler for
    ``signum`` itself: without one, CPython writes nothing to the wakeup fd for it.

    Raises:
        UsageError: the watcher is not installed yet and this is not the main thread.
    """
    install()
    _callbacks[signum] = callback


def install() -> None:
    """Start the watcher and point the signal wakeup fd at it, once. Main thread only.

    Raises:
        UsageError: called first from another thread than the main thread.
    """
    global _installed
    if _installed:
        return
    require_main_thread()
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    forward_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read_fd, forward_fd), name="rankguard-signals",
                     daemon=True).start()
    _installed = True


def require_main_thread() -> None:
    """Raise :class:`UsageError` unless this is the main thread (where handlers are set)."""
    if threading.current_thread() is not threading.main_thread():
        raise UsageError("rankguard.init()", "must be called from the main thread",
                         "signal handlers can only be installed there")


def _watch(read_fd: int, forward_fd: int) -> None:
    while True:
        data = os.read(read_fd, 64)
        if not data:
            return
        if forward_fd >= 0:  # a wakeup fd set before ours (an event loop) still gets its bytes
            try:
                os.write(forward_fd, data)
            except OSError:
                pass
        for signum in dict.fromkeys(data):  # each signal once, in the order they came
            callback = _callbacks.get(signum)
            if callback is not None:
                _call(signum, callback)


def _call(signum: int, callback: Callable[[], None]) -> None:
    """Run one callback; what it raises (a full disk under a stack dump) is said on stderr and
    the watcher goes on, so that the next signal (a SIGTERM) is still answered."""
    try:
        callback()
    except Exception as exc:  # noqa: BLE001 (the watcher must outlive any callback)
        try:
            os.write(2, f"rankguard: answering signal {signum} failed: {exc!r}\n".encode())
        except OSError:
            pass
