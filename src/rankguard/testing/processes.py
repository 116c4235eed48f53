"""The processes a test started, what they are doing, and their stacks.

A test's processes are the ones whose environment carries the test's tag (every descendant
inherits it, however started: subprocess, multiprocessing fork or spawn, a double-forked
daemon) plus the new ones the session's ``proctree.Tracking`` holds: every descendant of the
test process, and those that cleared their environment and detached (``setsid env -i``, a
double fork), which stay in its cgroup, or in its tree as their subreaper.

Stacks come from the process itself when it can answer, asked with a signal to its main thread,
the dump read from the file it appends to: a child forked from the test process inherits the
plugin's faulthandler registration on ``STACK_SIGNAL`` (a real-time signal, so that SIGUSR1 and
SIGUSR2 stay the tests' own: a forked child still dies of them); a process of rankguard's
runtime (a rank) answers ``SIGUSR1`` into its own file. Any other process is described from
/proc: state, where the kernel has it waiting, command line. A signal is never sent to a process
that does not catch it (the default action of either would kill it).
"""

from __future__ import annotations

import os
import signal

import psutil

from ..processes import proctree, stack_requests
from ..runtime import stacks

TAG = "RANKGUARD_PYTEST_TAG"
# The pytest process's own stack request; a real-time signal nothing else is likely to own
# (threading libraries take the lowest ones, from SIGRTMIN up).
STACK_SIGNAL = signal.SIGRTMAX - 2
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


def own_stacks_file(pid: int) -> str:
    """Where rankguard's runtime in process ``pid`` writes its stacks (see
    ``runtime.stacks.path_for``)."""
    try:
        environ = psutil.Process(pid).environ()
    except psutil.Error:
        environ = {}
    return stacks.path_for(pid, environ)


def ask_stacks(pid: int, plugin_file: str | None) -> str | None:
    """The stacks of ``pid``: dumped on ``STACK_SIGNAL`` into ``plugin_file`` (the pytest
    process's, inherited by a forked child), else on the runtime's SIGUSR1 into its own file;
    None if it catches neither, or did not answer.

    Bounded by ``_DUMP_BUDGET_S``. A stopped process is continued so it can answer.
    """
    if plugin_file is not None and proctree.catches(pid, STACK_SIGNAL):
        sig, files = STACK_SIGNAL, [plugin_file]
    elif proctree.catches(pid, stack_requests.RANK_SIGNAL):
        sig, files = stack_requests.RANK_SIGNAL, [own_stacks_file(pid)]
    else:
        return None
    return stack_requests.ask({pid: (pid, files)}, _DUMP_BUDGET_S, sig=sig).get(pid)
