"""Recording in the ledger when issued operations complete, off the hot path.

A Python done-callback on every collective's future costs tens of microseconds (the backend's
thread must take the GIL from the main thread) and makes gloo abort the process at exit when a
script never destroys its group. Instead, an operation only appends its work to a deque, and
a later operation marks done, in the calling thread, the works at the head that completed (for
synchronous collectives, all of them): a rank that keeps issuing operations keeps its ledger
current by itself. Those of the entering operation's group are recorded in the same ledger
write as its entry (:meth:`CompletionTracker.enter`): one write and one clock read per
operation.

That look costs a few microseconds when it runs, as it does, with cold caches right after the
previous operation's wait; so once a process has issued its first ``EXACT_OPS`` operations it
looks only when ``REAP_AT`` works are held, and a completion may reach the ledger up to
``REAP_AT - 1`` operations late while the rank issues more. That changes no judgement: a rank
that enters operations is making progress whatever its count of completions, and the launcher's
first-step mark (the first collective of a round completed) falls within the exact ones. At most
``REAP_AT`` completed works (and the tensors they hold) are kept beyond those outstanding.

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

At interpreter exit the thread is stopped and the works it holds are kept alive for good
(:meth:`CompletionTracker.close`): destroyed at exit by gloo's worker thread, a work would abort
the process.

The issuing thread's entry points are :meth:`CompletionTracker.issue` (enter, start, watch: the
whole operation in one call, for the path with nothing else to do between those steps) and
:meth:`CompletionTracker.enter` then :meth:`CompletionTracker.add` (for a caller that needs the
entry number, or acts between them). Any thread may :meth:`CompletionTracker.flush`.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import threading
from typing import Any, Callable, Protocol, TypeVar

MIN_LAG_S = 0.02
EXACT_OPS = 16  # a process's first operations: each marks the previous done as it enters
REAP_AT = 4  # after those: the works held before an entering operation looks for completed ones
MAX_LAG_S = 1.0
# Of the supervisor's hang timeout, the share a completion may reach the ledger late: a rank is
# judged only after a whole hang timeout without an event, so 7/8 of it is left as margin.
LAG_SHARE = 0.125


class Slot(Protocol):
    """A group's slot in the progress ledger, as the tracker writes it (``ledger``'s)."""

    def step(self, kind: int, finished: int) -> int:
        """Record ``finished`` completions and the entry of an operation of ``kind``; returns
        its entry number."""

    def done(self, wait: bool = True) -> bool:
        """Record one completion (``wait=False``: only if no other thread is writing it)."""


class Work(Protocol):
    """An issued operation's handle (gloo's work)."""

    def is_completed(self) -> bool:
        """Whether the operation is over (done or failed)."""


W = TypeVar("W", bound=Work)


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
        self._pending: collections.deque[tuple[Slot, Work]] = collections.deque()
        self._reap_at = 1  # below this many works held, an entry is just ``slot.step(kind, 0)``
        self._asleep = True  # the thread waits for works (or is not started): wake() it
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # held by whoever consumes the queue
        self._start_lock = threading.Lock()
        self._exact_left = EXACT_OPS  # entries that look at every held work; then REAP_AT
        self.sweeps = 0  # how many times the thread has swept, for tests and benchmarks
        self.on_sweep: Callable[[], None] | None = None  # called on the thread after a sweep

    @property
    def asleep(self) -> bool:
        """Whether the thread waits for works to be added (or is not started yet)."""
        return self._asleep

    def issue(self, slot: Slot, kind: int, start: Callable[..., W], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> W:
        """Enter an operation of ``kind`` in ``slot`` (as :meth:`enter`), start it with
        ``start(*args, **kwargs)`` and watch the work that returns (as :meth:`add`); returns
        that work. Only the thread that issues ``slot``'s operations may call it.

        One call frame for the whole step: this runs on every operation, right after the
        previous one's wait, with cold caches, where each frame costs microseconds.

        Raises: whatever ``start`` raises (bad arguments, a connection gone), after recording
        the operation done: refused at once, it is not in progress.
        """
        pending = self._pending
        if len(pending) < self._reap_at:
            slot.step(kind, 0)
        else:
            self.enter(slot, kind)
        try:
            work = start(*args, **kwargs)
        except BaseException:
            slot.done()
            raise
        pending.append((slot, work))
        if self._asleep:
            self.wake()
        return work

    def enter(self, slot: Slot, kind: int) -> int:
        """Record in ``slot`` that the calling thread enters an operation of ``kind``; returns
        its entry number. Only the thread that issues ``slot``'s operations may call it.

        When enough works are held (see the module doc), first takes off the head of the queue
        the works that completed (for synchronous collectives, all of them): those of ``slot``
        are recorded done in the same ledger write as the entry (``slot.step``), those of other
        groups each on its own.

        Never waits for the sweeper: if it holds the queue, only the entry is recorded (the
        sweeper marks what it finds completed).
        """
        pending = self._pending
        if len(pending) < self._reap_at:
            return slot.step(kind, 0)
        finished = 0
        if self._exact_left:
            self._exact_left -= 1
            if not self._exact_left:
                self._reap_at = REAP_AT
        if self._lock.acquire(blocking=False):
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

    def add(self, slot: Slot, work: Work) -> None:
        """Watch ``work``, the operation just entered with :meth:`enter`; call ``slot.done()``
        when it completes."""
        self._pending.append((slot, work))
        if self._asleep:
            self.wake()

    def wake(self) -> None:
        """Have the thread sweep (start it, the first time): works were added while it
        waited for some."""
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
        """Stop the thread (waiting at most ``timeout`` s) and let go of every pending work,
        which is kept alive for the rest of the process.

        A work is marked completed before the backend's worker thread drops its own
        reference to it. Released here, at exit, the last reference could be the worker's: it
        would then destroy the work, and with it decref its tensors' Python objects, during
        interpreter finalization, where taking the GIL ends the thread and the C++ runtime
        aborts the process (``terminate called without an active exception``: SIGABRT after
        a script that exits right after its last collective). Never destroyed, a work only
        loses the worker's reference."""
        self._closing.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for _, work in self._pending:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(work))
        self._pending.clear()

    def flush(self, wait: bool = True) -> bool:
        """Mark done, now and in the calling thread, every tracked work that has completed;
        returns whether it could.

        ``wait=False`` is for the SIGTERM teardown: its thread must never wait for a lock that
        the main thread may hold, for the main thread may be stopped in a signal handler that
        waits for the teardown. It then flushes only if the queue is free, and marks done only
        the works whose slot is free; the others stay queued.
        """
        pending = self._pending
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            for _ in range(len(pending)):
                item = pending.popleft()
                if not (item[1].is_completed() and item[0].done(wait)):
                    pending.append(item)  # the same item: the thread knows it by identity
        finally:
            self._lock.release()
        return True

    def _oldest(self) -> tuple[Slot, Work] | None:
        try:
            return self._pending[0]
        except IndexError:
            return None

    def _run(self) -> None:
        pending = self._pending
        seen = None  # the oldest outstanding work after the previous sweep
        period = self.lag
        while True:
            self._wake.clear()
            if not pending:
                self._asleep = True
                if not pending:  # re-check: add() may have appended before it saw asleep
                    self._wake.wait()
            self._asleep = False
            if self._closing.wait(period):
                return
            self.flush()
            self.sweeps += 1
            hook = self.on_sweep
            if hook is not None:
                try:
                    hook()
                except Exception:  # noqa: BLE001 (the sweeps must go on)
                    pass
            oldest = self._oldest()
            period = MIN_LAG_S if oldest is not None and oldest is seen else self.lag
            seen = oldest
