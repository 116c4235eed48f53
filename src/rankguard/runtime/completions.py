"""Recording in the ledger when issued operations complete, off the hot path.

A Python done-callback on every collective's future costs tens of microseconds (the backend's
thread must take the GIL from the main thread) and makes gloo abort the process at exit when a
script never destroys its group. Instead, an operation only appends its work to a deque, and
the next operation marks done, in the calling thread, the works at the head that completed (for
synchronous collectives, the previous one): a rank that keeps issuing operations keeps its
ledger current by itself. Those of the entering operation's group are recorded in the same
ledger write as its entry (:meth:`CompletionTracker.enter`): one write and one clock read per
operation.

What is left is the rank that stops issuing: it computes, or waits in its last collective. For
it, one daemon thread marks done the outstanding works that completed, every ``lag`` seconds
while any is outstanding, and waits on an event, at no cost, while none is. Its cost is
therefore one wake-up per ``lag`` during a job's collectives, whatever their rate. A work still
outstanding a whole ``lag`` after a sweep first saw it (a long collective, or one that hangs) is
checked every ``MIN_LAG_S`` until it completes.

So an operation that completed is shown waiting until ``2 * lag`` after it was entered at the
latest, or ``MIN_LAG_S`` after it completed if that is later (plus scheduling delays). The
reader that judges by it, the launcher's hang monitor, calls a rank waiting only after
``--hang-timeout`` without an event, and the bootstrap sets ``lag`` to a fraction of that
(:func:`lag_for`): only an operation that itself took about the whole hang timeout can be seen
waiting after it completed, for ``MIN_LAG_S``. Where nobody judges ``done`` against a limit
(pools, the pytest plugin, stock torchrun) ``lag`` is ``MAX_LAG_S``. The rank's own decisions
(is it inside a collective? at exit, on SIGTERM, when regrouping) call
:meth:`CompletionTracker.flush` first, so they are exact.

At interpreter exit the thread is stopped and the works it holds are released before modules
are torn down (left to finalization, gloo could abort the process).
"""

from __future__ import annotations

import atexit
import collections
import threading
from typing import Any

MIN_LAG_S = 0.02
MAX_LAG_S = 1.0
# Of the supervisor's hang timeout, the share a completion may reach the ledger late: a rank is
# judged only after a whole hang timeout without an event, so 7/8 of it is left as margin.
LAG_SHARE = 0.125


def lag_for(hang_timeout: float | None) -> float:
    """How late a completion may reach the ledger when a supervisor judges the rank after
    ``hang_timeout`` seconds without an event (None: nobody does): between ``MIN_LAG_S`` and
    ``MAX_LAG_S``."""
    if hang_timeout is None:
        return MAX_LAG_S
    return min(MAX_LAG_S, max(MIN_LAG_S, hang_timeout * LAG_SHARE))


class CompletionTracker:
    """Marks operations done in their ledger slot once their work completes, at most ``lag``
    seconds late (see the module doc)."""

    def __init__(self, lag: float = MAX_LAG_S) -> None:
        self.lag = lag
        self._pending: collections.deque[tuple[Any, Any]] = collections.deque()
        self._wake = threading.Event()  # set while works are outstanding
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # held by whoever consumes the queue
        self._start_lock = threading.Lock()
        self.sweeps = 0  # how many times the thread has swept, for tests and benchmarks

    def enter(self, slot: Any, kind: int) -> int:
        """Record in ``slot`` that the calling thread enters an operation of ``kind``; returns
        its entry number. First takes off the head of the queue the works that completed (for
        synchronous collectives, the previous one): those of ``slot`` are recorded done in the
        same ledger write as the entry (``slot.step``), those of other groups each on its own.
        So the ledger is current even for a rank that dies before the next sweep.

        Never waits for the sweeper: if it holds the queue, only the entry is recorded (the
        sweeper marks what it finds completed).
        """
        finished = 0
        pending = self._pending
        if pending and self._lock.acquire(blocking=False):
            try:
                while pending and pending[0][1].is_completed():
                    owner = pending.popleft()[0]
                    if owner is slot:
                        finished += 1
                    else:
                        owner.done()
            finally:
                self._lock.release()
        return slot.step(kind, finished)

    def add(self, slot: Any, work: Any) -> None:
        """Watch ``work``, the operation just entered with :meth:`enter`; call ``slot.done()``
        when it completes."""
        self._pending.append((slot, work))
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
        self._closing.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._pending.clear()

    def flush(self) -> None:
        """Mark done, now and in the calling thread, every tracked work that has completed."""
        pending = self._pending
        with self._lock:
            for _ in range(len(pending)):
                item = pending.popleft()
                if item[1].is_completed():
                    item[0].done()
                else:
                    pending.append(item)  # the same item: the thread knows it by identity

    def _oldest(self) -> tuple[Any, Any] | None:
        try:
            return self._pending[0]
        except IndexError:
            return None

    def _run(self) -> None:
        pending = self._pending
        seen = None  # the oldest outstanding work after the previous sweep
        period = self.lag
        while True:
            self._wake.wait()
            if self._closing.wait(period):
                return
            self.flush()
            self.sweeps += 1
            self._wake.clear()
            if pending:  # re-check after clearing: add() may have seen the event still set
                self._wake.set()
            oldest = self._oldest()
            period = MIN_LAG_S if oldest is not None and oldest is seen else self.lag
            seen = oldest
