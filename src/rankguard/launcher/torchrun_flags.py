"""torchrun's command line where it is not rankguard's own: the options that have no effect
here (taken, checked as torchrun checks them, and said once on stderr), the ``PET_<NAME>``
variables torchrun reads its options' values from, and ``--signals-to-handle``.

Which torchrun options exist is torch's parser's to say: ``tests/launcher/test_torchrun_flags.py``
compares the pinned torch's ``torchrun --help`` with ``rankguard run``'s, option by option.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
from dataclasses import dataclass

from ..errors import UsageError
from ..inputs.options import number
from .config import DEFAULT_SIGNALS


@dataclass(frozen=True)
class _NoEffect:
    """A torchrun option that has no effect under rankguard: taken, checked as torchrun checks
    it, and ``why`` said once on stderr."""

    flags: tuple[str, ...]
    why: str
    choices: tuple[str, ...] | None = None
    seconds: bool = False  # its value is a number of seconds


_IN_THE_LOGS = "every rank's full output is in LOG_DIR/attemptN/rankR.log: grep there"
_NO_EFFECT = (
    _NoEffect(("--monitor-interval", "--monitor_interval"), "rankguard sees rank exits and "
              "output as events, with no polling interval, and judges hangs by "
              "--hang-timeout", seconds=True),
    _NoEffect(("--start-method", "--start_method"), "each rank is a new process that runs "
              "the script, as torchrun runs a script (a start method applies only to a "
              "Python function entrypoint)", choices=("spawn", "fork", "forkserver")),
    _NoEffect(("--event-log-handler", "--event_log_handler"), "rankguard writes its events "
              "to its journal, LOG_DIR/journal.jsonl"),
    _NoEffect(("--logs-specs", "--logs_specs"), "rankguard writes every rank's output to "
              "LOG_DIR/attemptN/rankR.log and loads no torchrun.logs_specs plug-in"),
    _NoEffect(("--numa-binding", "--numa_binding"), "rankguard does not bind ranks to CPUs "
              "(wrap the script in numactl with --no-python)",
              choices=("node", "socket", "exclusive", "core-complex")),
    _NoEffect(("--duplicate-stdout-filters", "--duplicate_stdout_filters"), _IN_THE_LOGS),
    _NoEffect(("--duplicate-stderr-filters", "--duplicate_stderr_filters"), _IN_THE_LOGS),
)


# torchrun's options that also take their value from the environment, PET_<NAME> (torch's
# argparse_util.env and check_env); the table test compares this with torch's parser
TORCHRUN_ENV = (
    "nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf",
    "standalone", "max_restarts", "monitor_interval", "start_method", "event_log_handler",
    "role", "module", "no_python", "run_path", "log_dir", "redirects", "tee",
    "local_ranks_filter", "duplicate_stdout_filters", "duplicate_stderr_filters", "node_rank",
    "master_addr", "master_port", "local_addr", "signals_to_handle", "shutdown_timeout",
    "virtual_local_rank",
)


def environment_defaults(p: argparse.ArgumentParser) -> None:
    """Take torchrun's ``PET_<NAME>`` variables as the defaults of their options, as torchrun
    does (the command line still wins); a switch's is an integer, nonzero for on.

    Raises:
        UsageError: a switch's variable that is not an integer.
    """
    for action in p._actions:
        names = {flag.lstrip("-").replace("-", "_") for flag in action.option_strings}
        for name in names.intersection(TORCHRUN_ENV):
            value = os.environ.get(f"PET_{name.upper()}")
            if value is None:
                continue
            if action.nargs == 0:  # a switch
                if not re.fullmatch(r"[+-]?[0-9]+", value.strip(), re.ASCII):
                    raise UsageError(f"PET_{name.upper()}", f"{value!r} is not an integer",
                                     f"set it to 1 (as --{name.replace('_', '-')}) or 0")
                action.default = int(value) != 0
            else:
                action.default = value


def _dest(option: _NoEffect) -> str:
    return option.flags[0].lstrip("-").replace("-", "_")


def add_no_effect_options(p: argparse.ArgumentParser) -> None:
    """Add torchrun's options that have no effect here to ``p`` (their values: None when not
    given)."""
    for option in _NO_EFFECT:
        p.add_argument(*option.flags, dest=_dest(option), default=None, choices=option.choices,
                       help=f"torchrun's; no effect: {option.why}")


def notes(ns: argparse.Namespace) -> tuple[str, ...]:
    """One line for each torchrun option given that has no effect here (its value checked as
    torchrun checks it).

    Raises:
        UsageError: a value torchrun would refuse.
    """
    notes = []
    for option in _NO_EFFECT:
        value = getattr(ns, _dest(option))
        if value is None:
            continue
        if option.seconds:
            number(option.flags[0], value, float, 0, f"seconds, e.g. {option.flags[0]} 5")
        notes.append(f"{option.flags[0]} has no effect here: {option.why}")
    if ns.run_path and ns.no_python:
        notes.append("--no-python has no effect with --run-path, which takes precedence (as "
                     "in torchrun): the script runs in the rank's Python interpreter")
    return tuple(notes)


_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)
_KEPT_IGNORED = (signal.SIGHUP, signal.SIGQUIT)  # nohup, or a shell's background job


def default_signals() -> tuple[signal.Signals, ...]:
    """torchrun's default ``--signals-to-handle``, less a SIGHUP or SIGQUIT this process was
    started ignoring: ``nohup rankguard run ...`` outlives its terminal, as before."""
    return tuple(sig for sig in signals(",".join(DEFAULT_SIGNALS))
                 if sig not in _KEPT_IGNORED or signal.getsignal(sig) != signal.SIG_IGN)


# signals a healthy launcher receives in its normal course: never a request to stop
_ROUTINE = {signal.SIGCHLD: "each time a rank exits", signal.SIGWINCH: "when its terminal is "
            "resized", signal.SIGURG: "with a socket's urgent data", signal.SIGCONT: "when it "
            "is resumed after a stop"}


def signals(text: str) -> tuple[signal.Signals, ...]:
    """``--signals-to-handle SIGTERM,SIGUSR1,...``: signal names, as torchrun takes them."""
    found = []
    for name in (part.strip() for part in text.split(",")):
        sig = signal.Signals.__members__.get(name)
        if sig is None:
            raise UsageError("--signals-to-handle", f"{name!r} is not a signal name",
                             "give names, e.g. --signals-to-handle SIGTERM,SIGINT,SIGUSR1")
        if sig in _UNCATCHABLE:
            raise UsageError("--signals-to-handle", f"{name} cannot be caught",
                             "leave it out: it ends the launcher at once (its guardian then "
                             "stops every rank)")
        if sig in _ROUTINE:
            raise UsageError("--signals-to-handle", f"{name} comes to a healthy launcher "
                             f"{_ROUTINE[sig]}: handling it would stop every run",
                             "leave it out")
        found.append(sig)
    return tuple(dict.fromkeys(found))
