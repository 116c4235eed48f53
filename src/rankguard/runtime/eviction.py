"""Clean eviction on SIGTERM, also while the main thread is blocked inside a collective.

A Python ``signal.signal`` handler runs only when the main thread returns to the interpreter,
which a rank blocked in a gloo collective with a frozen peer does not do for the backend's
timeout. So the handler is only half of it: the runtime's **watcher thread** (``signal_watch``)
reads Python's signal wakeup fd, where the C-level handler writes the signal number at once,
whatever the main thread is doing, and starts the teardown:

1. retire every instrumented process group: a main thread waiting in a bounded collective wakes
   within one slice, and no new collective starts;
2. mark the pending completions in the ledger (so the supervisor's record is exact);
3. keep torch's Flight Recorder dump of the rank beside its stacks file (groups rankguard does
   not wrap, NCCL's: ``async_groups.keep_torch_dump``), before anything aborts them;
   then abort NCCL communicators (``ncclCommAbort``), for at most ``NCCL_ABORT_S``: a
   synchronisation before it would wait behind a collective stuck on a peer for good; gloo has
   no in-process abort: its connections close when the process exits, which makes its peers
   fail at once instead of waiting;
4. once the abort returned, drain the device's remaining work: ``torch.cuda.synchronize()``,
   for at most ``NCCL_SYNC_S`` and only where CUDA was initialised (a kernel of the rank's own
   that never ends must not keep it);
5. flush stdout and stderr, and end the process with ``os._exit(0)``, or with the code the
   rank was already leaving with (its script had ended; see ``bootstrap``). An abort or a
   synchronisation cut short is said in the last line; the exit releases what they held.

Its last line says why the rank was stopped as far as the rank knows it: the launcher posts in
the rank's ledger, before its SIGTERM, which rank failed (this one, when it was blamed); without
such a notice the SIGTERM came from elsewhere (an orchestrator evicting the rank).

The steps run in a worker thread bounded by the grace budget; past it the process ends with
:data:`EXIT_TEARDOWN_TIMEOUT` after naming the step that overran. Parts that do not exist (no
torch, no process group, no CUDA) are skipped without a word. If the program replaces the SIGTERM
handler after :func:`install`, the program owns SIGTERM and the watcher stands aside.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from ..records import ledger as _ledger
from ..margins import NCCL_ABORT_S, NCCL_SYNC_S
from . import async_groups, groups, nccl_abort, signal_watch, stacks
from .state import current

DEFAULT_GRACE_S = 5.0
EXIT_TEARDOWN_TIMEOUT = 143  # what an orchestrator sees from a process that SIGTERM ended

_lock = threading.Lock()
_grace = DEFAULT_GRACE_S
_begun = False
_finished = threading.Event()
_installed = False
_handling = False  # the main thread is in _on_sigterm (the only thread that runs it)


def install(grace: float = DEFAULT_GRACE_S) -> None:
    """Tear down cleanly and exit 0 on SIGTERM, within ``grace`` seconds.

    Call from the main thread. Calling again only changes the budget.

    Raises:
        UsageError: called from another thread than the main thread.
    """
    global _grace, _installed
    _grace = grace
    if _installed:
        return
    signal_watch.require_main_thread()
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal_watch.on(signal.SIGTERM, _on_watched_sigterm)
    _installed = True


def _on_watched_sigterm() -> None:
    """The watcher's part: start the teardown at once, unless the program owns SIGTERM now."""
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        begin("SIGTERM")


def _on_sigterm(signum: int, frame: object) -> None:
    """The main thread's part: start the teardown if the watcher has not, then stay out of its
    way (no more user code runs) until it ends the process.

    A second SIGTERM (the launcher signals the rank's process group, then its process) runs this
    handler again inside the first, wherever the main thread got to: that one returns at once.
    Were it to go on, it would wait on what the first holds (``_lock``: the watcher waits on it
    too, and the rank hangs until SIGKILL) or for a teardown the first has not started yet."""
    global _handling
    if _handling:
        return
    _handling = True
    begin("SIGTERM")
    _finished.wait(_grace + 1.0)
    os._exit(EXIT_TEARDOWN_TIMEOUT)


def begin(reason: str) -> None:
    """Start the bounded teardown (once); the process ends when it is done."""
    global _begun
    with _lock:
        if _begun:
            return
        _begun = True
    threading.Thread(target=_run, args=(reason,), name="rankguard-teardown", daemon=True).start()


def _run(reason: str) -> None:
    started = time.monotonic()
    progress = {"step": "starting"}
    worker = threading.Thread(target=_steps, args=(reason, progress), daemon=True)
    worker.start()
    worker.join(_grace)
    who = f"rank {os.environ['RANK']}" if "RANK" in os.environ else f"pid {os.getpid()}"
    took = time.monotonic() - started
    if worker.is_alive():
        _say(f"rankguard: {who}: {reason}: teardown step '{progress['step']}' overran its "
             f"{_grace:g} s budget; exiting {EXIT_TEARDOWN_TIMEOUT}")
        _finished.set()
        os._exit(EXIT_TEARDOWN_TIMEOUT)
    released = progress.get("released", "")
    code = _leaving_code()
    _say(f"rankguard: {who}: {_stopped_because(reason)}: torn down in {took:.2f} s{released}; "
         f"exiting {code}")
    _finished.set()
    os._exit(code)


def _leaving_code() -> int:
    """The exit code the rank's script had already ended with, else 0."""
    ledger = current().ledger
    if ledger is not None and ledger.recorded_fault() == _ledger.FAULT_EXITING:
        return ledger.exit_code()
    return 0


def _stopped_because(reason: str) -> str:
    """Why the rank is being torn down, from the launcher's notice in its ledger when there
    is one: ``stopped by the launcher, which blamed this rank for a hang (SIGTERM)``."""
    notice = groups.supervisor_notice()
    if notice is None:
        return reason
    kind, failed = notice
    if str(failed) == os.environ.get("RANK"):
        blame = "for a hang" if kind == "hung" else "as the first rank that failed"
        return f"stopped by the launcher, which blamed this rank {blame} ({reason})"
    return f"stopped by the launcher because {_ledger.notice_text(kind, failed)} ({reason})"


def _torch_importing() -> bool:
    """Whether torch is being imported (the SIGTERM came while the script imported it): a
    module that is still executing is marked so on its spec, as Python's own "partially
    initialized module" error reads it."""
    return any(getattr(getattr(sys.modules.get(name), "__spec__", None), "_initializing", False)
               for name in ("torch", "torch.cuda", "torch.distributed"))


def _steps(reason: str, progress: dict[str, str]) -> None:
    state = current()
    ledger = state.ledger
    if ledger is not None:
        progress["step"] = "record the teardown"
        # never waits: the main thread may hold the queue, stopped in our signal handler
        state.completions.flush(wait=False)
        if ledger.recorded_fault() == _ledger.FAULT_NONE:  # else that fault tells the story
            ledger.record_fault(_ledger.FAULT_TERMINATED, ledger.in_collective())
        ledger.set_flag(_ledger.FLAG_TERMINATING)
    progress["step"] = "retire process groups"
    live = state.groups.live()
    groups.retire_all(f"terminating ({reason})")
    released = []
    if live:
        released.append(f"{len(live)} process group{'s' * (len(live) > 1)} released")
    if not _torch_importing():  # else its modules are partial, and no group can exist yet
        progress["step"] = "write torch's Flight Recorder dump"
        if async_groups.keep_torch_dump() is not None:  # before the abort completes every op
            released.append("torch's Flight Recorder dump kept")
        progress["step"] = "abort NCCL communicators"
        aborted = nccl_abort.abort(nccl_abort.nccl_groups(), NCCL_ABORT_S)
        if aborted.groups:
            released.append(_abort_said(aborted))
        progress["step"] = "torch.cuda.synchronize"
        if aborted.finished and not nccl_abort.synchronize(NCCL_SYNC_S):
            released.append(f"device work left running after {NCCL_SYNC_S:g} s")
    if released:
        progress["released"] = f" ({'; '.join(released)})"
    progress["step"] = "flush output"
    stacks.discard_if_empty()  # os._exit skips atexit
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def _abort_said(aborted: nccl_abort.Aborted) -> str:
    """``2 NCCL communicators aborted in 0.41 s``, or what went wrong, for the last line."""
    what = f"{aborted.groups} NCCL communicator{'s' * (aborted.groups > 1)}"
    if not aborted.finished:
        return f"{what}: abort cut short after {aborted.took_s:.2f} s"
    if aborted.error:
        return f"{what}: abort failed: {aborted.error}"
    return f"{what} aborted in {aborted.took_s:.2f} s"


def _say(line: str) -> None:
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass
