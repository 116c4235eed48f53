"""Performing injected faults for real, inside the rank they target.

The rank's bootstrap builds one :class:`Injector` from the specs in its environment. Faults tied
to a moment of the program (``start``, ``init``, ``opN``, ``stepN``) run in the main thread at that
moment; faults tied to a time run from a timer thread, and those that must act in the main
thread (hang, slow, raise) reach it through a Python-level interrupt of the main thread.

Each fault is recorded in the rank's ledger as it fires, before it is performed, and so is each
``StepLoop`` step the rank begins: the launcher tells from them which faults never fired, and
how far the rank got (``launcher.injections``).
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time

from ..deadline import Deadline
from ..records.ledger import LedgerWriter
from .spec import FaultSpec, InjectedFault

# A signal number whose Python handler performs main-thread faults. Only its Python handler is
# used, through _thread.interrupt_main: no signal is ever sent to the process.
_MAIN_THREAD_SIGNAL = signal.SIGUSR2


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _busy_python(seconds: float) -> None:
    end = Deadline.after(seconds)
    while not end.passed():
        pass


def _busy_holding_gil(seconds: float) -> None:
    # sum() over a range runs in C without ever releasing the GIL; calibrate its speed first.
    n = 2_000_000
    start = time.perf_counter()
    sum(range(n))
    rate = n / max(time.perf_counter() - start, 1e-6)
    sum(range(int(min(seconds * rate, 2**62))))


def perform(spec: FaultSpec) -> None:
    """Carry out ``spec`` now, in the calling thread. Returns only for ``slow`` and ``gil``."""
    print(f"rankguard: injecting {spec.text}", file=sys.stderr, flush=True)
    kind = spec.kind
    if kind == "crash":
        _flush()
        os._exit(int(spec.arg or 1))
    if kind == "raise":
        raise InjectedFault(f"fault injected by --inject {spec.text}")
    if kind in ("kill", "term", "stop"):
        _flush()
        sig = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "stop": signal.SIGSTOP}[kind]
        os.kill(os.getpid(), sig)
        if kind == "stop":
            return  # resumed by SIGCONT: carry on as if nothing happened
        time.sleep(3600)  # a rank that handles SIGTERM itself: wait for it to act
        return
    if kind == "hang":  # a real deadlock: the thread waits on a lock it holds
        held = threading.Lock()
        held.acquire()
        held.acquire()
    if kind == "slow":
        _busy_python(float(spec.arg or 0))
        return
    if kind == "gil":
        _busy_holding_gil(float(spec.arg) if spec.arg is not None else 1e9)
        return
    raise AssertionError(f"unhandled fault kind {kind}")  # parse() admits only known kinds


_Armed = tuple[int, FaultSpec]  # a fault of this rank, and its place in RANKGUARD_INJECT


class Injector:
    """The faults that apply to this rank in this attempt, and the hooks that trigger them."""

    def __init__(self, specs: list[FaultSpec], rank: int, attempt: int,
                 ledger: LedgerWriter | None = None) -> None:
        """``specs``: every spec of the run, in ``RANKGUARD_INJECT``'s order (a fault is
        recorded in ``ledger`` by its place there); those of ``rank`` and ``attempt`` apply."""
        self._ledger = ledger
        mine = [(place, s) for place, s in enumerate(specs) if s.applies_to(rank, attempt)]
        self._start = [a for a in mine if a[1].at == "start"]
        self._init = [a for a in mine if a[1].at == "init"]
        self._by_op: dict[int, list[_Armed]] = {}
        self._by_step: dict[int, list[_Armed]] = {}
        for armed in mine:
            if armed[1].at == "op":
                self._by_op.setdefault(armed[1].op, []).append(armed)
            elif armed[1].at == "step":
                self._by_step.setdefault(armed[1].op, []).append(armed)
        self._timed = [a for a in mine if a[1].at == "time"]
        self.active = bool(mine)

    def _fire(self, armed: _Armed) -> None:
        place, spec = armed
        if self._ledger is not None:
            self._ledger.record_injection(place)
        perform(spec)

    def at_start(self) -> None:
        """Run ``at=start`` faults and arm the timed ones (timer threads, daemonic)."""
        for armed in self._start:
            self._fire(armed)
        if self._timed:
            signal.signal(_MAIN_THREAD_SIGNAL, self._on_main_thread_interrupt)
        for armed in self._timed:
            timer = threading.Timer(armed[1].seconds, self._fire_timed, args=(armed,))
            timer.daemon = True
            timer.start()

    def at_init(self) -> None:
        for armed in self._init:
            self._fire(armed)

    def before_op(self, seq: int) -> None:
        """Called before the ``seq``-th collective of the default group (1-based); performs its
        faults in the order given, as at ``start`` and ``init``."""
        for armed in self._by_op.get(seq, ()):
            self._fire(armed)

    def before_step(self, step: int) -> None:
        """Called by ``StepLoop`` before it runs ``step``; records the step in the ledger and
        performs that step's faults once (a step run again after a recovery does not fault
        again)."""
        if self._ledger is not None:
            self._ledger.record_step(step)
        for armed in self._by_step.pop(step, ()):
            self._fire(armed)

    @property
    def has_op_faults(self) -> bool:
        return bool(self._by_op)

    _pending: _Armed | None = None

    def _fire_timed(self, armed: _Armed) -> None:
        if armed[1].kind in ("hang", "slow", "raise"):
            self._pending = armed
            _thread.interrupt_main(_MAIN_THREAD_SIGNAL)
        else:
            self._fire(armed)

    def _on_main_thread_interrupt(self, signum: int, frame: object) -> None:
        armed, self._pending = self._pending, None
        if armed is not None:
            self._fire(armed)
