"""The processes a test started, what they are doing, and their stacks.

A test's processes are the ones whose environment carries the test's tag (every descendant
inherits it, however started: subprocess, multiprocessing fork or spawn, a double-forked
daemon) plus the new ones the session's ``proctree.Tracking`` holds: every descendant of the
test process, and those that cleared their environment and detached (``setsid env -i``, a
double fork), which stay in its cgroup, or in its tree as their subreaper.

Stacks come from the process itself when it can answer: if it catches ``SIGUSR1`` (rankguard's
runtime in a rank, or a child forked from the test process, which inherits the plugin's
faulthandler registration), the signal goes to its main thread and the dump is read from the
file it appends to. Any other process is described from /proc: state, where the kernel has it
waiting, command line. A signal is never sent to a process that does not catch it (the default
action of SIGUSR1 would kill it).
"""

from __future__ import annotations

import os
import signal

import psutil

from .. import proctree, stack_requests
from ..runtime import stacks

TAG = "RANKGUARD_PYTEST_TAG"
_DUMP_BUDGET_S = 0.5


def tagged(tag: str, exclude: set[int] = frozenset()) -> list[int]:  # type: ignore[assignment]
    """Live processes carrying ``tag``, children first-found order, without ``exclude``."""
    return [pid for pid in proctree.with_env(TAG, tag) if pid not in exclude]


# Helpers that multiprocessing starts once per interpreter and shares between all later uses;
# they end with the test process. Not a test's leak, and killing one breaks the next test.
_SHARED_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def is_shared_helper(pid: int) -> bool:
    """Whether ``pid`` is multiprocessing's resource tracker or forkserver of this process."""
    try:
        proc = psutil.Process(pid)
        return proc.ppid() == os.getpid() and any(
            helper in " ".join(proc.cmdline()) for helper in _SHARED_HELPERS)
    except psutil.Error:
        return False


def catches(pid: int, sig: int) -> bool:
    """Whether ``pid`` has a handler for ``sig`` (SigCgt in /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        pass
    return False


def own_stacks_file(pid: int) -> str:
    """Where rankguard's runtime in process ``pid`` writes its stacks (see
    ``runtime.stacks.path_for``)."""
    try:
        environ = psutil.Process(pid).environ()
    except psutil.Error:
        environ = {}
    return stacks.path_for(pid, environ)


def ask_stacks(pid: int, files: list[str]) -> str | None:
    """The stacks ``pid`` dumps on SIGUSR1 into one of ``files``, or None if it cannot answer.

    Bounded by ``_DUMP_BUDGET_S``. A stopped process is continued so it can answer.
    """
    if not catches(pid, signal.SIGUSR1):
        return None
    return stack_requests.ask({pid: (pid, files)}, _DUMP_BUDGET_S).get(pid)
