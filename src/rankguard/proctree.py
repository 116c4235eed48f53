"""Finding and killing every process of a job, however it was started.

A job's processes are found three ways, so that none escapes: the process tree under each rank
(psutil), each rank's process group, and a marker in the environment (``RANKGUARD_RUN_TOKEN``)
that every descendant inherits, found by reading ``/proc/*/environ``. The last one also finds
processes that left their process group or were re-parented to init.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal

import psutil

MARKER = "RANKGUARD_RUN_TOKEN"


def with_env(var: str, value: str) -> list[int]:
    """PIDs of live processes whose environment carries ``var=value`` (not this process)."""
    needle = f"{var}={value}\0".encode()
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                data = f.read() + b"\0"
        except OSError:
            continue
        if needle in data:
            found.append(int(entry))
    return [pid for pid in found if alive(pid)]


def with_marker(token: str) -> list[int]:
    """PIDs of live processes of the run whose marker is ``token``."""
    return with_env(MARKER, token)


def is_stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (SIGSTOP and friends; not a tracer stop)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def descendants(pid: int) -> list[int]:
    """PIDs of every live descendant of ``pid`` (empty when it is gone)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def signal_tree(pid: int, sig: int, *, group: bool = True) -> None:
    """Send ``sig`` to ``pid``, its descendants and (``group``) its process group; no errors."""
    targets = [pid, *descendants(pid)]
    if group:
        try:
            os.killpg(pid, sig)
        except OSError:
            pass
    for target in targets:
        try:
            os.kill(target, sig)
        except OSError:
            pass


_TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())
_libc = ctypes.CDLL(None, use_errno=True)


def signal_main_thread(pid: int, sig: int) -> None:
    """Send ``sig`` to the main thread of ``pid`` (tgkill), not to whichever thread takes it.

    A process-directed signal may be handled by any thread; a stack dump requested that way
    from a stopped process can run after its main thread has moved on. Falls back to ``kill``
    where the syscall number is unknown.

    Raises:
        ProcessLookupError: ``pid`` does not exist.
    """
    if _TGKILL is None:
        os.kill(pid, sig)
        return
    if _libc.syscall(_TGKILL, pid, pid, sig) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def kill_all(pids: list[int]) -> None:
    """SIGKILL each of ``pids`` (and SIGCONT, so that stopped ones die at once); no errors."""
    for pid in pids:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.kill(pid, sig)
            except OSError:
                pass


def describe(pid: int) -> str:
    """One line for reports: pid, name, state, kernel wait channel, command line (or that the
    process is gone)."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            state = proc.status()
            cmd = " ".join(proc.cmdline())[:300]
            name = proc.name()
    except psutil.Error:
        return f"pid {pid} (gone)"
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
    except OSError:
        wchan = ""
    waiting = f", waiting in {wchan}" if wchan and wchan != "0" else ""
    return f"pid {pid} ({name}), {state}{waiting}: {cmd}"


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent (pid ``parent``) dies; exit at once
    if it already has. No-op where prctl is unavailable."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal N`` for a number that names no signal."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_detail(returncode: int) -> str:
    """How a process ended, from its Popen return code: ``was killed by SIGKILL`` or
    ``exited with code 3``."""
    if returncode < 0:
        return f"was killed by {signal_name(-returncode)}"
    return f"exited with code {returncode}"
