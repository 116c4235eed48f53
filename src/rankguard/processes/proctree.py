"""Finding and killing every process of a job, however it was started.

A job's processes are found several ways, so that none escapes: the process tree under each rank
(psutil), each rank's process group, a marker in the environment (``RANKGUARD_RUN_TOKEN``) that
every descendant inherits, found by reading ``/proc/*/environ``, and a :class:`Tracking` of
everything started under the launcher (or a pytest session), which also holds the processes
that cleared their environment and left their session and process tree (``setsid env -i``,
double-forked): a cgroup where one can be made, and the launcher as the child subreaper that
orphans are re-parented to.
"""

from __future__ import annotations

import ctypes
import os
import platform
import select
import signal

import psutil

from .. import margins
from ..deadline import Deadline

MARKER = "RANKGUARD_RUN_TOKEN"


def with_env(var: str, value: str) -> list[int]:
    """PIDs of live processes whose environment carries ``var=value`` (not this process); none
    when /proc cannot be listed (no file descriptor is left: a later sweep finds them)."""
    needle = f"{var}={value}\0".encode()
    found: list[int] = []
    me = os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
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


def with_marker(token: str, var: str = MARKER) -> list[int]:
    """PIDs of live processes of the run whose marker (``var``) is ``token`` (not this
    process): those that carry the marker, and the members of the run's cgroup (see
    :class:`Tracking`), looked up beside this process's own cgroup: how the guardian, which the
    launcher started before it entered that cgroup, finds the processes of a launcher that was
    SIGKILLed."""
    found = set(with_env(var, token))
    home = own_cgroup()
    if home is not None:
        found.update(cgroup_members(os.path.join(home, CGROUP_PREFIX + token)))
    found.discard(os.getpid())
    return sorted(pid for pid in found if alive(pid))


def is_stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (SIGSTOP and friends; not a tracer stop)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def stat_fields(pid: int, tid: int | str | None = None) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` (of thread ``tid``'s ``/proc/PID/task/TID/stat``)
    from the state (field 3) on, after the command name (which may hold spaces and
    parentheses); None if it cannot be read."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path) as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (``SigCgt`` in /proc): sending it a
    signal it does not catch would, for most signals, end it."""
    return _in_mask(f"/proc/{pid}/status", "SigCgt:", sig)


def _in_mask(status: str, field: str, sig: int) -> bool:
    """Whether the signal mask ``field`` of the /proc ``status`` file holds ``sig`` (False if
    it cannot be read)."""
    try:
        with open(status) as f:
            mask = next(line for line in f if line.startswith(field)).split()[1]
    except (OSError, StopIteration, IndexError):
        return False
    return bool(int(mask, 16) >> (sig - 1) & 1)


def _blocks(pid: int, sig: int) -> bool:
    """Whether the main thread of ``pid`` blocks ``sig`` (``SigBlk`` in /proc; False if it
    cannot be read)."""
    return _in_mask(f"/proc/{pid}/task/{pid}/status", "SigBlk:", sig)


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def descendants(pid: int) -> list[int]:
    """PIDs of every live descendant of ``pid`` (empty when it is gone, or when this process
    has no file descriptor left to read /proc with: ``signal_tree`` still signals the process
    and its group, which needs none)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except (psutil.Error, OSError):
        return []


def in_session(sid: int) -> list[int]:
    """PIDs of the live processes of session ``sid`` (what a session leader started and left
    behind, its leader gone; not this process); none when /proc cannot be read."""
    found = []
    me = os.getpid()
    for pid in psutil.pids():
        try:
            if pid != me and os.getsid(pid) == sid:
                found.append(pid)
        except OSError:
            continue
    return found


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
    where the syscall number is unknown, and where the main thread blocks ``sig``
    (``pthread_sigmask``): it would stay pending there for good, where another thread takes it.

    Raises:
        ProcessLookupError: ``pid`` does not exist.
    """
    if _TGKILL is None or _blocks(pid, sig):
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


def kill_and_reap(pids: list[int], budget: float = margins.REAP_S) -> None:
    """SIGKILL ``pids`` (see :func:`kill_all`), wait up to ``budget`` s for them to end, and
    reap those that are children of this process (orphans re-parented to it as the child
    subreaper of a :class:`Tracking`), so that none stays a zombie; no errors."""
    kill_all(pids)
    await_exits(pids, Deadline.after(budget), reap=True)


def await_exits(pids: list[int], deadline: Deadline, *, reap: bool = False) -> list[int]:
    """Wait, on pidfds (no polling), until every one of ``pids`` has ended or ``deadline``
    passed; returns those still running. ``reap``: reap those that are children of this
    process as they end. No errors."""
    waiting: dict[int, int] = {}
    for pid in pids:
        try:
            waiting[os.pidfd_open(pid)] = pid
        except OSError:
            continue  # gone (and reaped) already
    try:
        while waiting and not deadline.passed():
            ready, _, _ = select.select(list(waiting), [], [], deadline.wait_time_or_none())
            for fd in ready:
                pid = waiting.pop(fd)
                os.close(fd)
                if reap:
                    _reap(pid)
    finally:
        for fd in waiting:
            os.close(fd)
    return sorted(waiting.values())


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not a child of this process: its own parent reaps it


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
    if it already has. No-op where prctl is unavailable.

    The kernel ties this to the **thread** of the parent that started the process, not to the
    whole parent: start such processes from a thread that outlives them (the launcher's main
    thread, a pool's supervisor thread), or they are killed when that thread ends."""
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


def teardown_detail(returncode: int) -> str:
    """How a process that got SIGTERM and tore itself down (``runtime.eviction``, which records
    it in the rank's ledger) ended: ``got SIGTERM (tore itself down, exited with code 0)``."""
    return f"got SIGTERM (tore itself down, {exit_detail(returncode)})"


# -- tracking every process started under this one ----------------------------------------------

CGROUP_PREFIX = "rankguard-"
NO_CGROUP = "RANKGUARD_NO_CGROUP"
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


class Tracking:
    """Every process started from this process since the tracking began, however it detached.

    A process that clears its environment (``env -i``), leaves its session (``setsid``) and is
    orphaned (a double fork) carries no marker and is in no process tree from the root of the
    job. Two ways hold on to it, used together with the environment ``marker`` (``(VAR,
    value)``, see :func:`with_env`):

    - **a cgroup** (v2, where this process may create one: root and a writable hierarchy): this
      process moves into a new cgroup ``rankguard-NAME`` beside its own, and every process
      forked from then on is a member for good, whatever it does to its environment, session or
      parent. A process still in the original cgroup finds it by name (:func:`with_marker`),
      after this one was SIGKILLed too.
    - **this process as the child subreaper** (``PR_SET_CHILD_SUBREAPER``): a descendant
      orphaned by a double fork is re-parented to it rather than to init, so it stays in its
      process tree. The orphans :func:`kill_and_reap` kills are reaped; one that ends on its
      own stays a zombie of this process (never counted as alive) until it exits.

    What still escapes: a process started on the tracked processes' behalf by one outside the
    tree (``systemd-run``, ``at``, a container runtime, ssh to localhost); where no cgroup can
    be made (not root, read-only ``/sys/fs/cgroup``, ``RANKGUARD_NO_CGROUP=1``), an orphan once
    this process is gone (init adopts it); and a process that moves itself out of the cgroup
    (root only) while this process is gone.

    Args:
        name: names the cgroup (``rankguard-NAME``); unique among the trackings of one cgroup.
        marker: ``(VAR, value)``: processes whose environment carries it belong too.
    """

    def __init__(self, name: str, marker: tuple[str, str] | None = None) -> None:
        self.name = name
        self._marker = marker
        self._pid = os.getpid()
        self._was_subreaper = _subreaper()  # a tracking inside another (pytest in pytest)
        _set_subreaper(True)
        self._baseline = set(descendants(self._pid))  # started before: not tracked
        self._home = own_cgroup()
        self.cgroup = _enter(self._home, name) if self._home is not None else None

    def processes(self) -> list[int]:
        """PIDs of the live processes started since the tracking began (not this one)."""
        found = set(descendants(self._pid)) - self._baseline
        if self.cgroup is not None:
            found.update(cgroup_members(self.cgroup))
        if self._marker is not None:
            found.update(with_env(*self._marker))
        found.discard(self._pid)
        return sorted(pid for pid in found if alive(pid))

    def close(self, kill: bool) -> None:
        """End the tracking; no errors. The processes it holds that are still alive are killed
        (``kill``), or go back to the cgroup this process came from with it (helpers meant to
        outlive the tracking); its cgroup is removed."""
        if kill:
            kill_and_reap(self.processes())
        _set_subreaper(self._was_subreaper)
        if self.cgroup is None or self._home is None:
            return
        for pid in [self._pid, *cgroup_members(self.cgroup)]:
            _move(pid, self._home)
        _remove(self.cgroup)
        self.cgroup = None


def forget(name: str) -> None:
    """Remove the cgroup of the tracking ``name`` beside this process's own, once it is empty
    (the guardian, after its sweep of a SIGKILLed launcher's processes); no errors."""
    home = own_cgroup()
    if home is not None:
        _remove(os.path.join(home, CGROUP_PREFIX + name))


def cgroup_members(folder: str) -> list[int]:
    """PIDs in the cgroup ``folder`` and in the cgroups below it (empty when it is gone)."""
    pids: list[int] = []
    for sub, _, _ in os.walk(folder):
        try:
            with open(os.path.join(sub, "cgroup.procs")) as f:
                pids.extend(int(line) for line in f if line.strip())
        except (OSError, ValueError):
            continue
    return pids


def _set_subreaper(on: bool) -> None:
    try:
        _libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)
    except AttributeError:
        pass


def _subreaper() -> bool:
    flag = ctypes.c_int(0)
    try:
        _libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    except AttributeError:
        pass
    return bool(flag.value)


def own_cgroup() -> str | None:
    """The folder of this process's cgroup in the cgroup v2 hierarchy, or None when there is
    none or it is turned off (``RANKGUARD_NO_CGROUP``)."""
    if os.environ.get(NO_CGROUP, "0") not in ("", "0"):
        return None
    try:
        with open("/proc/self/cgroup") as f:
            path = next((line[3:].rstrip("\n") for line in f if line.startswith("0::")), None)
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    for fields in mounts:
        dash = fields.index("-") if "-" in fields else -1
        if path is None or dash < 0 or fields[dash + 1] != "cgroup2":
            continue
        root, point = fields[3].rstrip("/"), fields[4]
        if path != root and not path.startswith(root + "/"):
            continue  # this process's cgroup is not visible in that mount
        folder = point.rstrip("/") + path[len(root):]
        if os.path.isdir(folder):
            return folder
    return None


def _enter(home: str, name: str) -> str | None:
    """Make the cgroup ``rankguard-NAME`` beside ``home`` and move this process into it;
    None when that is not allowed here."""
    try:
        stale = [entry for entry in os.listdir(home) if entry.startswith(CGROUP_PREFIX)]
    except OSError:
        return None
    for entry in stale:
        _remove(os.path.join(home, entry))  # left by a process that was SIGKILLed
    folder = os.path.join(home, CGROUP_PREFIX + name)
    for _ in range(3):  # another process's clean-up may remove it between mkdir and the move
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError:
            return None
        if _move(os.getpid(), folder):
            return folder
    _remove(folder)
    return None


def _move(pid: int, folder: str) -> bool:
    try:
        with open(os.path.join(folder, "cgroup.procs"), "w") as f:
            f.write(str(pid))
        return True
    except OSError:
        return False


def _remove(folder: str) -> None:
    """Remove the cgroup ``folder`` and the ones below it, each only if it is empty."""
    for sub, _, _ in os.walk(folder, topdown=False):
        try:
            os.rmdir(sub)
        except OSError:
            pass
