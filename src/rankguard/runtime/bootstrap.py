"""The first code a rank runs under ``rankguard run``; then it runs the user's script unchanged.

``python -m rankguard.runtime.bootstrap [--spare | --no-python] (SCRIPT | -m MODULE) [ARGS...]``

With ``--spare`` the process is a warm spare: it imports torch ahead of time, then waits for one
JSON line on stdin, the environment of the rank it becomes (EOF: it is not needed, exit 0).
With ``--no-python`` (torchrun's) SCRIPT is an executable: the process ties its life to the
launcher's (step 1 below), then becomes SCRIPT by ``exec``; none of the other steps apply, and
a Python program it starts is watched only if it calls ``rankguard.init()``, which finds the
ledger in the environment.

Before the script starts it:

1. asks the kernel to SIGKILL this rank if the launcher dies (and exits if it already has);
2. maps the progress ledger the launcher created (``RANKGUARD_LEDGER``);
3. installs a stack dump of all threads on SIGUSR1 (see ``stacks``), written to
   ``RANKGUARD_STACKS``;
4. installs the SIGTERM teardown (see ``eviction``) with the budget ``RANKGUARD_GRACE``, and
   bounded mode when the launcher sets a job-wide ``RANKGUARD_COLLECTIVE_TIMEOUT``;
5. arms the injected faults of this rank and attempt (``RANKGUARD_INJECT``);
6. instruments ``torch.distributed`` as soon as it is imported (see ``instrument``), without
   importing torch itself, so that a script that never uses torch pays nothing for it.

An exception that escapes the script is printed as Python would, recorded in the ledger with its
time (so the launcher can tell the first fault from its victims), and ends the rank with code 1.
A script that ends (returns, or ``sys.exit(code)``) is recorded as leaving, with its code and
the time, before the interpreter's teardown (slow with torch): the launcher then knows when the
rank left, not only when its process finally died, and a rank that left before a collective
its peers went on to is the root cause of their failure. A usage error (a
``rankguard.UsageError`` that escaped, or argparse's ``SystemExit(2)`` refusing the script's
arguments) is recorded as such, with its message: the launcher neither replaces nor restarts a
rank that every process running the script would fail the same way.

A rank whose launcher said that the attempt ends (it refused to replace a failed peer, see
``vacancies.refusal``) and whose script then raised leaves at once after the traceback (its
exit handlers run, the interpreter's finalization does not): that finalization takes seconds
with torch, and the old group's gloo work, stuck on a peer that is leaving too, would fail in
the middle of it and abort the process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import runpy
import sys
import traceback
from typing import Any

from ..records import ledger as _ledger
from ..inputs import options
from ..processes import proctree
from .. import exit_waits
from ..errors import CollectiveError, UsageError, in_chain
from ..inject import perform as _perform
from ..inject import spec as _spec
from . import deadline_scope
from . import (completions, eviction, failures, init, instrument, stacks, store_reachable,
               vacancies)
from .state import current


def _die_with_launcher() -> None:
    launcher = int(os.environ.get("RANKGUARD_LAUNCHER_PID", "0"))
    if launcher:
        proctree.die_with_parent(launcher)


class _InstrumentOnImport(importlib.abc.MetaPathFinder):
    """Runs ``instrument.install()`` right after ``torch.distributed`` has been imported."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch.distributed":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            original_exec(module)
            instrument.install()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _wait_for_activation() -> None:
    """Spare mode: pay for ``import torch`` and the imports a training script's first lines
    trigger now, then become the rank the launcher names."""
    _warm_up()

    line = sys.stdin.buffer.readline()
    if not line:
        os._exit(0)
    os.environ.update(json.loads(line))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the user's script gets no stdin, as a cold rank
    os.close(devnull)


def _warm_up() -> None:
    """What a spare pays before it is needed: ``import torch`` (2.5 s here), torch.distributed
    and DDP, the lazy imports of an optimizer's first construction (torch._dynamo: 2.2 s
    more, which a replacement would otherwise pay between its ``init_process_group`` and its
    first step), and, where torch sees a GPU, CUDA's initialisation (the driver and runtime:
    the part of a new rank's CUDA start that does not depend on its device, which a spare
    cannot know; the device's context is made when the script picks it, except where torch
    sees one GPU only: the rank can only pick that one, whose context the spare makes now).
    Nothing forks after it: the spare becomes the rank in this process."""
    import torch
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    if torch.cuda.is_available():
        torch.cuda.init()
        if torch.cuda.device_count() == 1:
            torch.zeros(1, device="cuda:0")  # the context, as the rank's first tensor makes it


def _prepare(rank: int, attempt: int) -> None:
    state = current()
    ledger_path = os.environ.get(_ledger.PATH_ENV)
    if ledger_path:
        state.ledger = _ledger.LedgerWriter(ledger_path)
        state.ledger.set_flag(_ledger.FLAG_BOOTSTRAPPED)
    try:
        if os.environ.get(stacks.PATH_ENV):
            stacks.install()
            if state.ledger is not None:
                state.ledger.set_flag(_ledger.FLAG_STACKS_READY)
        eviction.install(init.grace_from_env())
        if os.environ.get(init.COLLECTIVE_TIMEOUT_ENV):
            deadline_scope.set_default(deadline_scope.check_seconds(
                init.COLLECTIVE_TIMEOUT_ENV, os.environ[init.COLLECTIVE_TIMEOUT_ENV]))
            state.enable_bounded()
        # the launcher judges a rank by its ledger after --hang-timeout: completions must
        # reach the ledger well within it
        current().completions.lag = completions.lag_for(store_reachable.wait_limit(None))
        options.gloo_mode()  # refused here, before the script, rather than inside it
    except UsageError as error:
        print(f"rankguard: {error}", file=sys.stderr)
        sys.exit(2)
    state.namespace = os.environ.get("RANKGUARD_NAMESPACE")
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:  # before the script may
        state.launcher_store = (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
    injector = _perform.Injector(_spec.decode(os.environ.get("RANKGUARD_INJECT", "")), rank,
                                 attempt, state.ledger)
    if injector.active:
        state.injector = injector
        state.record_only = False
    if "torch.distributed" in sys.modules:
        instrument.install()
    else:
        sys.meta_path.insert(0, _InstrumentOnImport())
    injector.at_start()


def _run_user_code(argv: list[str]) -> None:
    if argv[0] == "-m":
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args]
        sys.path[0] = os.getcwd()
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, args = argv[0], argv[1:]
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


def _collective_error(error: BaseException | None) -> CollectiveError | None:
    """The rankguard collective error in ``error``'s chain (it may be wrapped), if any."""
    found = in_chain(error, lambda e: isinstance(e, CollectiveError))
    return found if isinstance(found, CollectiveError) else None


def _usage_error(error: BaseException) -> UsageError | None:
    """The ``rankguard.UsageError`` that ``error`` is, or was raised from (``raise ... from``,
    at most ``CHAIN_DEPTH`` deep): a mistake of the script's, which every process running it
    makes again. An error raised while one was being handled (its ``__context__``) is not
    counted: the handler's own failure may have any cause."""
    found = in_chain(error, lambda e: isinstance(e, UsageError), context=False)
    return found if isinstance(found, UsageError) else None


def _from_backend(error: BaseException) -> bool:
    """Whether ``error`` is a communication backend's failure (a collective that failed because
    a peer did), even though its operation is recorded as completed by then."""
    dist = sys.modules.get("torch.distributed")
    backend_error = getattr(dist, "DistError", None) if dist is not None else None
    if backend_error is not None and isinstance(error, backend_error):
        return True
    return failures.is_backend_failure(error)


def _exit_code(code: object) -> int:
    """The status a process ends with for ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1  # a message: Python prints it and exits 1


def _arguments_refused(leaving: SystemExit) -> str | None:
    """argparse's message when ``leaving`` is its refusal of the script's command line
    (``ArgumentParser.error``: exit code 2, raised in ``ArgumentParser.exit``, whose
    ``message`` it printed), else None."""
    frames = leaving.__traceback__
    if frames is None or _exit_code(leaving.code) != 2:
        return None
    while frames.tb_next is not None:
        frames = frames.tb_next
    frame = frames.tb_frame
    if frame.f_globals.get("__name__") != "argparse" or frame.f_code.co_name != "exit":
        return None
    message = frame.f_locals.get("message")
    return str(message).strip() if message else "argparse refused the script's arguments"


def _record_exit(code: int, refused: str | None = None) -> None:
    """Record that the script ended with ``code`` (``refused``: argparse's message, when it
    refused the script's arguments: a usage error; so is a non-zero exit after
    ``internal.exits_on_usage_error``)."""
    state = current()
    if code != 0 and refused is None:
        refused = state.usage_exit  # the plugin's ranks that collected different tests
    if state.ledger is not None:
        state.completions.flush()
        state.ledger.record_exit(code, state.ledger.in_collective(), _ledger.ErrorKind.OTHER
                                 if refused is None else _ledger.ErrorKind.USAGE, refused or "")


def _become(argv: list[str]) -> None:
    """``--no-python``: become the executable ``argv[0]`` (searched on ``PATH`` as torchrun's
    launch does), keeping the launcher's parent-death signal (execve keeps it); exit 127 with
    one line if it cannot be run."""
    try:
        os.execvp(argv[0], argv)
    except OSError as error:
        print(f"rankguard: cannot run {argv[0]!r} (--no-python): {error.strerror}",
              file=sys.stderr)
        os._exit(127)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    spare = bool(argv) and argv[0] == "--spare"
    no_python = bool(argv) and argv[0] == "--no-python"
    if spare or no_python:
        argv = argv[1:]
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        print("usage: python -m rankguard.runtime.bootstrap [--spare | --no-python] "
              "(SCRIPT | -m MODULE) [ARGS...]", file=sys.stderr)
        sys.exit(2)
    _die_with_launcher()
    if no_python:
        _become(argv)
    if spare:
        _wait_for_activation()
    _prepare(int(os.environ.get("RANK", "0")), int(os.environ.get("RANKGUARD_ATTEMPT", "0")))
    try:
        _run_user_code(argv)
    except SystemExit as leaving:
        _record_exit(_exit_code(leaving.code), _arguments_refused(leaving))
        raise
    except BaseException as error:
        ledger = current().ledger
        if ledger is not None:
            current().completions.flush()  # so "inside a collective" is exact, not stale
            failure = _collective_error(error)
            if failure is not None:
                ledger.record_blame(failure.missing)  # the launcher blames them, not this rank
            usage = _usage_error(error)
            if usage is not None:  # the launcher neither replaces nor restarts the rank
                ledger.record_error(_ledger.ErrorKind.USAGE, str(usage))
            ledger.record_fault(_ledger.FAULT_RAISED, failure is not None
                                or ledger.in_collective() or _from_backend(error))
        traceback.print_exc()
        sys.stderr.flush()
        if vacancies.refusal() is not None:
            exit_waits.leave_now(1)  # see the module docstring
        sys.exit(1)
    _record_exit(0)


if __name__ == "__main__":
    main()
