"""Recording in the ledger when issued operations complete, off the hot path.

A Python done-callback on every collective's future costs tens of microseconds (the backend's
thread must take the GIL from the main thread) and makes gloo abort the process at exit when a
script never destroys its group. Instead, the operation only appends its work to a deque; one
daemon thread checks ``work.is_completed()`` every ``SWEEP_S`` while any work is outstanding,
and sleeps on an event, at no cost, while none is.

The ledger therefore shows a completion up to ``SWEEP_S`` late, far below any hang timeout.
At interpreter exit the thread is stopped and the works it holds are released before modules
are torn down (left to finalization, gloo could abort the process).
"""

from __future__ import annotations

import atexit
import collections
import threading
import time
from typing import Any

SWEEP_S = 0.02


class CompletionTracker:
    """Marks operations done in their ledger slot once their work completes."""

    def __init__(self) -> None:
        self._pending: collections.deque[tuple[Any, Any]] = collections.deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # held by whoever consumes the queue
        self._start_lock = threading.Lock()
        self._closing = False

    def add(self, slot: Any, work: Any) -> None:
        """Watch ``work``; call ``slot.done()`` when it completes.

        First marks done the works at the head of the queue that already completed (for
        synchronous collectives, the previous one), so the ledger is current even for a rank
        that dies before the next sweep. Never waits: if the sweeper holds the queue, it skips.
        """
        pending = self._pending
        if pending and self._lock.acquire(blocking=False):
            try:
                while pending and pending[0][1].is_completed():
                    pending.popleft()[0].done()
            finally:
                self._lock.release()
        pending.append((slot, work))
        if not self._wake.is_set():
            self._wake.set()
            if self._thread is None:
                self._start()

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rankguard-completions",
                                                daemon=True)
                self._thread.start()
                atexit.register(self.close)

    def close(self, timeout: float = 1.0) -> None:
        """Stop the thread (waiting at most ``timeout`` s) and release every pending work."""
        self._closing = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._pending.clear()

    def flush(self) -> None:
        """Mark done, now and in the calling thread, every tracked work that has completed."""
        pending = self._pending
        with self._lock:
            for _ in range(len(pending)):
                slot, work = pending.popleft()
                if work.is_completed():
                    slot.done()
                else:
                    pending.append((slot, work))

    def _run(self) -> None:
        pending = self._pending
        while not self._closing:
            self._wake.wait()
            time.sleep(SWEEP_S)
            self.flush()
            self._wake.clear()
            if pending:  # re-check after clearing: add() may have seen the event still set
                self._wake.set()
