"""Each test's deadline, enforced from a thread of the test process.

The plugin arms the watchdog at the start of every phase of a test (setup, call, teardown) with
that phase's deadline and disarms it at the end. When a deadline passes, the watchdog thread,
which never waits on anything the test holds:

1. writes the stacks of every thread of the test process, and of every process the test started
   that can answer (see ``processes``), and describes the others;
2. **releases** them: retires this process's rankguard process groups (a collective waiting in
   bounded mode raises at once), SIGTERM to each of the test's process trees (a rankguard rank
   tears itself down and exits 0), ``margins.RELEASE_GRACE_S`` (waiting on pidfds), SIGKILL;
3. interrupts the main thread with ``INTERRUPT_SIGNAL``, whose handler raises
   :class:`DeadlineExceeded` carrying the report: a Python-level wait (sleep, lock, queue, join,
   a socket, a pipe) ends, the test fails with the report, and the session goes on. It is a
   real-time signal, so that a test may own SIGUSR1 and SIGUSR2 (its own handler would have
   taken the interruption); a forked child gets its default action back (the watchdog does not
   run there);
4. if the main thread does not come back within ``LAST_RESORT_S`` (stuck inside C code that
   never returns to Python), hands the report to ``last_words`` (the plugin reports the test as
   failed and finishes the session: the report reaches the terminal and the junit XML, see
   ``abort``) for up to ``LAST_WORDS_S``, writes it to fd 2 itself if that did not end, and
   ends the process with exit status 2, so a CI job still ends on its own.

All of this runs in Python, so it needs the GIL. A main thread that holds it inside C code
(``ctypes.PyDLL``, an extension that does not release it) stops every Python thread, this one
too: for that case a **backstop** of faulthandler's (a C thread, no GIL needed) is set to
``BACKSTOP_S`` after each deadline, and pushed back by the watchdog thread as soon as it takes
the expiry in hand. When it fires, it writes every thread's Python stack to the terminal and
ends the process with exit status 1 (no junit XML: nothing else can run).
"""

from __future__ import annotations

import contextlib
import faulthandler
import math
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ..processes import proctree
from ..deadline import Deadline
from ..margins import RELEASE_GRACE_S
from . import processes, torch_cases

INTERRUPT_SIGNAL = signal.SIGRTMAX - 1  # see processes.STACK_SIGNAL for the choice
LAST_RESORT_S = 10.0
LAST_WORDS_S = 10.0  # for the plugin's report of a session that must end (other plugins' hooks)
EXIT_ABORTED = 2  # pytest's "interrupted"
BACKSTOP_S = 5.0  # how late after a deadline the watchdog thread may take the expiry in hand
_DUMPS_BUDGET_S = 10.0  # allowance for the stack dumps of an expiry, before its release
_CASE_ANSWER_S = 1.0  # for a rank of a torch test case to answer (see torch_cases)
_EXPIRY_S = _DUMPS_BUDGET_S + RELEASE_GRACE_S + LAST_RESORT_S + LAST_WORDS_S + BACKSTOP_S


class DeadlineExceeded(BaseException):
    """A test phase ran past its deadline. A BaseException, so that a test's ``except
    Exception`` cannot swallow it."""


@dataclass
class Phase:
    """One armed phase of one test."""

    nodeid: str
    when: str  # setup | call | teardown
    deadline: Deadline  # Deadline.never() while the watchdog is paused
    tag: str  # the environment tag of the test's processes
    path: str  # the test's file, to point at its own frame in the stacks
    known: set[int] = field(default_factory=set)  # processes that are not the test's
    case: Any = None  # the test's instance (a unittest case), whose ranks it may know


class Watchdog:
    """Enforces the deadline of the armed phase; one per test process.

    Args:
        stacks_file: where children forked from this process dump their stacks on
            ``processes.STACK_SIGNAL``.
        tracking: holds the processes the tests start (see ``proctree.Tracking``).
        last_words: ``(phase, report, why) -> reported``, called (from another thread, for at
            most ``LAST_WORDS_S``) before the process ends because the main thread is stuck in
            C code; it must first give fd 2 back to the terminal. Without it, or when it
            returns False, the report is written to fd 2.
        backstop: whether to set faulthandler's backstop (not when the session uses
            faulthandler's own timer, ``faulthandler_timeout``: there is only one).
    """

    def __init__(self, stacks_file: str | None, tracking: proctree.Tracking,
                 last_words: Callable[[Phase, str, str], bool] | None = None,
                 backstop: bool = True) -> None:
        self._stacks_file = stacks_file
        self._backstop = backstop
        self._terminal: int | None = None  # fd 2 as it was before any test captured it
        self._tracking = tracking
        self._last_words = last_words
        self._cond = threading.Condition()
        self._phase: Phase | None = None
        self._pending: str | None = None  # a report for the main thread's interrupt handler
        self._disarms = 0  # phases ended so far: the expiry of one waits for its own end
        self._previous: Any = None
        self._firing: threading.Event | None = None  # set while an expiry is being handled
        self._thread: threading.Thread | None = None

    def install(self) -> None:
        """Install the interrupt handler (main thread) and start the watchdog thread."""
        self._previous = signal.signal(INTERRUPT_SIGNAL, self._interrupt)
        _restore_in_forked_children()
        if self._backstop:
            self._terminal = os.dup(2)
        self._thread = threading.Thread(target=self._run, name="rankguard-watchdog",
                                        daemon=True)
        self._thread.start()

    def arm(self, phase: Phase) -> None:
        with self._cond:
            self._phase = phase
            self._set_backstop(phase.deadline.later(BACKSTOP_S))
            self._cond.notify()

    @contextlib.contextmanager
    def paused(self) -> Iterator[list[float]]:
        """The armed phase's deadline stands still inside the block (for work with a bound of
        its own, such as starting a rank pool); yields a list that receives the seconds
        paused, by which the deadline moved."""
        paused: list[float] = []
        with self._cond:
            phase, saved = self._phase, Deadline.never()
            if phase is not None:
                saved, phase.deadline = phase.deadline, Deadline.never()
                self._set_backstop(Deadline.never())
        started = time.monotonic()
        try:
            yield paused
        finally:
            paused.append(time.monotonic() - started)
            with self._cond:
                if phase is not None and self._phase is phase:
                    phase.deadline = saved.later(paused[0])
                    self._set_backstop(phase.deadline.later(BACKSTOP_S))
                    self._cond.notify()

    def disarm(self) -> str | None:
        """End the phase; returns the report of its expiry, if it had one (raised already by
        the interruption, or not: the main thread returned on its own, e.g. because the
        release killed the child it waited for, or the interruption's exception was swallowed
        where Python cannot raise, in a finalizer).

        Runs with the interruption blocked in the main thread: it can neither cut this
        bookkeeping short nor take the report from it; one still on its way finds no report
        afterwards."""
        with _blocked(INTERRUPT_SIGNAL):
            with self._cond:  # read with the phase's hand-over: an expiry taken is seen here
                firing = self._firing
            if firing is not None:  # the main thread got free while the expiry was under way
                firing.wait(RELEASE_GRACE_S + _DUMPS_BUDGET_S)
            with self._cond:
                self._phase = None
                self._set_backstop(Deadline.never())
                report, self._pending = self._pending, None
                self._disarms += 1
                self._cond.notify()
        return report

    def _set_backstop(self, deadline: Deadline) -> None:
        """faulthandler's backstop fires at ``deadline`` (``Deadline.never()``: not at all)."""
        if self._terminal is None:
            return
        if math.isinf(deadline.at):
            faulthandler.cancel_dump_traceback_later()
        else:
            faulthandler.dump_traceback_later(deadline.wait_time(at_least=0.1), exit=True,
                                              file=self._terminal)

    def _interrupt(self, signum: int, frame: Any) -> None:
        # the report stays pending until the phase is disarmed: where the main thread runs a
        # finalizer (a __del__, a weakref callback), the exception raised here is only printed
        # ("Exception ignored in"), and the test would pass (1 run in 20 with xdist: the lock
        # a test made was finalized as it returned from joining the child the release killed)
        with self._cond:
            report = self._pending
        if report is not None:
            raise DeadlineExceeded(report)
        if callable(self._previous):
            self._previous(signum, frame)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._phase is None or not self._phase.deadline.passed():
                    deadline = None if self._phase is None else self._phase.deadline
                    self._cond.wait(None if deadline is None else deadline.wait_time_or_none())
                phase, self._phase = self._phase, None
                taken = self._disarms  # the phase ends with the next disarm
                self._firing = threading.Event()
                self._set_backstop(Deadline.after(_EXPIRY_S))  # this thread runs: push it
            report = self._expire(phase)
            with self._cond:
                self._pending = report
            self._firing.set()
            self._firing = None
            signal.pthread_kill(threading.main_thread().ident, INTERRUPT_SIGNAL)
            with self._cond:  # not any later phase's end: that one may run long, healthy
                ended = self._cond.wait_for(lambda: self._disarms != taken, LAST_RESORT_S)
            if not ended:
                self._abort(phase, report)

    def _expire(self, phase: Phase) -> str:
        lines = [f"rankguard: the deadline of {phase.deadline.seconds:g} s passed during the "
                 f"{phase.when} of {phase.nodeid}"]
        own = _own_stacks()
        main = _thread_block(own, threading.main_thread().ident)
        lines.append(f"stuck: the test process's main thread {_top_frame(main, phase.path)}")
        details = [f"--- test process (pid {os.getpid()}), all threads but the watchdog's:\n"
                   + own]
        pids = self._processes_of(phase)
        named = torch_cases.ranks(phase.case)
        for pid in pids:
            text = processes.ask_stacks(pid, self._stacks_file)
            main: str | None = None  # a signal's dump is written by the main thread
            if text is None and pid in named:  # written by torch's listener thread
                text = torch_cases.ask_stacks(phase.case, [pid],
                                              Deadline.after(_CASE_ANSWER_S)).get(pid)
                main = _main_thread_block(text or "")
            summary = proctree.describe(pid)
            if pid in named:
                summary = f"rank {named[pid]}: {summary}"
            if text:
                current = _thread_block(text, None) if main is None else main
                lines.append(f"stuck: {summary}\n  main thread {_top_frame(current, phase.path)}")
                details.append(f"--- {summary}\n{text}")
            else:
                lines.append(f"stuck: {summary} (no Python stacks: it does not answer a stack request)")
        lines.append(self._release(pids))
        return "\n".join(lines + [""] + details)

    def _processes_of(self, phase: Phase) -> list[int]:
        found = processes.tagged(phase.tag, phase.known)
        for pid in self._tracking.processes():
            if pid not in phase.known and pid not in found:
                found.append(pid)
        return [pid for pid in found
                if proctree.alive(pid) and not processes.is_shared_helper(pid)]

    @staticmethod
    def _release(pids: list[int]) -> str:
        runtime = sys.modules.get("rankguard.runtime.internal")
        if runtime is not None:
            runtime.retire_all("the test's deadline passed")
        for pid in pids:
            proctree.signal_tree(pid, signal.SIGTERM, group=False)
            proctree.signal_tree(pid, signal.SIGCONT, group=False)
        alive = proctree.await_exits(pids, Deadline.after(RELEASE_GRACE_S))
        for pid in alive:
            proctree.signal_tree(pid, signal.SIGKILL, group=False)
            proctree.kill_all([pid])
        if not pids:
            return "released: the test started no process"
        return (f"released: SIGTERM to {len(pids)} process(es) of the test"
                + (f", SIGKILL to {len(alive)} that outlived {RELEASE_GRACE_S:g} s" if alive
                   else ""))

    def _why_not_interrupted(self) -> str:
        """Why the main thread did not take the interruption: stuck inside C code, unless the
        test replaced the handler of ``INTERRUPT_SIGNAL`` (it then never raised)."""
        handler = signal.getsignal(INTERRUPT_SIGNAL)
        if handler == self._interrupt:
            return "stuck inside C code"
        named = {signal.SIG_IGN: "SIG_IGN", signal.SIG_DFL: "SIG_DFL", None: "a C handler"}
        what = (named[handler] if not callable(handler)
                else f"its own ({getattr(handler, '__qualname__', handler)!s})")
        return (f"the test replaced rankguard's handler of SIGRTMAX-1, the deadline's "
                f"interruption, with {what}: leave SIGRTMAX-1 and SIGRTMAX-2 to rankguard")

    def _abort(self, phase: Phase, report: str) -> None:
        why = (f"rankguard: the main thread did not return within {LAST_RESORT_S:g} s of its "
               f"interruption ({self._why_not_interrupted()}); ending the session "
               f"(exit {EXIT_ABORTED})")
        told = threading.Event()

        def tell() -> None:
            assert self._last_words is not None
            if self._last_words(phase, report, why):
                told.set()

        try:
            if self._last_words is not None:
                threading.Thread(target=tell, name="rankguard-last-words", daemon=True).start()
                told.wait(LAST_WORDS_S)
            if not told.is_set():
                os.write(2, f"{report}\n{why}\n".encode())
        finally:
            os._exit(EXIT_ABORTED)


@contextlib.contextmanager
def _blocked(signum: int) -> Iterator[None]:
    """``signum`` is held pending in the calling thread inside the block."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


_at_fork_registered = False


def _restore_in_forked_children() -> None:
    """A child forked from this process takes ``INTERRUPT_SIGNAL``'s default action again."""
    global _at_fork_registered
    if not _at_fork_registered:
        os.register_at_fork(after_in_child=lambda: signal.signal(INTERRUPT_SIGNAL,
                                                                 signal.SIG_DFL))
        _at_fork_registered = True


def _own_stacks() -> str:
    """Every thread's stack in this process, but the calling (watchdog) thread's."""
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        blocks = f.read().split("\n\n")
    return "\n\n".join(b for b in blocks if not b.lstrip().startswith("Current thread"))


def _thread_block(dump: str, ident: int | None) -> str:
    """The block of ``dump`` for thread ``ident`` (None: the thread that wrote it)."""
    head = "Current thread" if ident is None else f"Thread 0x{ident:016x}"
    blocks = dump.split("\n\n")
    for block in blocks:
        if block.lstrip().startswith(head) or (ident is not None and f"0x{ident:016x}" in
                                                block.split("\n", 1)[0]):
            return block
    return ""


def _main_thread_block(dump: str) -> str:
    """The main thread's block of a dump that another thread wrote: the last one listed
    (faulthandler lists the threads from the newest to the oldest)."""
    blocks = [b for b in dump.split("\n\n")
              if b.strip() and not b.lstrip().startswith("Current thread")]
    return blocks[-1] if blocks else ""


def _top_frame(block: str, test_path: str) -> str:
    """``at file:line in function`` for the innermost frame of a faulthandler thread block,
    and the innermost frame in the test's own file when that is another one."""
    frames = []
    for line in block.splitlines()[1:]:
        line = line.strip()
        if line.startswith('File "') and '", line ' in line:
            path, rest = line[6:].split('", line ', 1)
            number, _, func = rest.partition(" in ")
            frames.append((path, number, func))
    if not frames:
        return "(no Python frame)"
    text = "at {}:{} in {}".format(*frames[0])
    own = next((f for f in frames if f[0] == test_path), None)
    if own is not None and own != frames[0]:
        text += ", called from {}:{} in {}".format(*own)
    return text

