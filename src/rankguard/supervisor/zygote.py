"""The leader's side of a zygote (``supervisor.zygote_main``): a process that has imported torch
and a rank's entry module once, and forks ranks that start in milliseconds.

:class:`Zygote` starts it and asks it for ranks; each is a :class:`ForkedProcess`, which stands
in for the ``subprocess.Popen`` of a rank started cold (``pid``, ``poll``, ``wait``): the rank
is the zygote's child, so its exit status comes from the zygote. Its exit is seen as any rank's,
by its pidfd. Every wait is bounded; a zygote that died or stopped answering makes
:meth:`Zygote.fork` raise :class:`ZygoteUnavailable`, and its owner starts ranks cold instead.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..processes import proctree
from ..deadline import Deadline
from .rank_processes import spawn

MAX_MESSAGE = 1 << 20
# How long a rank's exit status may take to come from the zygote once its pidfd said it
# exited (the zygote reports it at its next SIGCHLD: milliseconds).
STATUS_REPORT_S = 5.0
LOST_CODE = -signal.SIGKILL  # a rank whose zygote died before it told: killed with it


class ZygoteUnavailable(Exception):
    """The zygote is not ready, died, or did not answer in time."""


class ForkedProcess:
    """A rank forked by a zygote, as much of a ``subprocess.Popen`` as a rank set uses."""

    stdout = None
    stderr = None

    def __init__(self, pid: int, zygote: Zygote) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._zygote = zygote
        self._exited = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, once the process has exited (call it then: its pidfd said so): as
        the kernel keeps it for its zombie, which the zygote holds until it has reported it,
        or as the zygote reported it; past ``timeout`` (default ``STATUS_REPORT_S``) without
        either, or when the zygote is gone, it counts as killed with SIGKILL."""
        code = _zombie_code(self.pid)
        if code is not None:
            self._ended(code)
        if not self._exited.wait(STATUS_REPORT_S if timeout is None else timeout):
            self._ended(LOST_CODE)
        assert self.returncode is not None
        return self.returncode

    def _ended(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._exited.set()


def _zombie_code(pid: int) -> int | None:
    """The exit status of ``pid`` while it is a zombie (``/proc/PID/stat``'s exit_code, as
    Popen's returncode: negative for a signal); None if it is not one or cannot be read. Its
    parent (the zygote) has not reaped it, so the pid still names that process."""
    fields = proctree.stat_fields(pid)
    if fields is None or len(fields) < 50 or fields[0] != "Z":
        return None
    status = int(fields[49])  # field 52 of stat, counted from the state (field 3)
    return os.waitstatus_to_exitcode(status)


class Zygote:
    """A zygote process that has imported ``modules``; see the module docstring.

    Args:
        modules: what it imports before it forks (torch, the ranks' entry module).
        env: its environment (a fork's own environment is given to :meth:`fork`).
        log: where its own output goes.
        on_change: called (from a thread of its own, under no lock of the zygote's) when it
            became ready or was lost.

    Start it from a thread that outlives it: it dies with that thread (PR_SET_PDEATHSIG).
    """

    def __init__(self, modules: Sequence[str], env: Mapping[str, str], log: str,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self._on_change = on_change
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._socket = ours
        self.proc = spawn([sys.executable, "-m", "rankguard.supervisor.zygote_main",
                           str(theirs.fileno()), str(os.getpid()), *modules], env, log=log,
                          pass_fds=(theirs.fileno(),))
        theirs.close()
        self._cond = threading.Condition()
        self._ready = False
        self._gone = False
        self._ids = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._forks: dict[int, ForkedProcess] = {}
        self._send_lock = threading.Lock()
        threading.Thread(target=self._read, name="rankguard-zygote", daemon=True).start()

    @property
    def ready(self) -> bool:
        return self._ready and not self._gone

    @property
    def gone(self) -> bool:
        return self._gone

    @property
    def imported(self) -> bool:
        """Whether it was ready once (it may have died since)."""
        return self._ready

    def wait_ready(self, until: Deadline) -> bool:
        """Wait until it has imported its modules (True), died or ``until`` passed (False)."""
        with self._cond:
            self._cond.wait_for(lambda: self._ready or self._gone, until.wait_time())
            return self.ready

    def fork(self, module: str, env: Mapping[str, str], log: str, fds: Mapping[str, int],
             until: Deadline) -> ForkedProcess:
        """A new rank running ``module.main()`` in a session of its own, with ``env``, its
        output appended to ``log``; each variable of ``fds`` names the descriptor it got (a
        copy of the one given here).

        Raises:
            ZygoteUnavailable: the zygote is not ready, died, failed to fork, or did not answer
                by ``until``.
        """
        with self._cond:
            if not self.ready:
                raise ZygoteUnavailable("the zygote is not ready" if not self._gone else
                                        "the zygote is gone")
            self._ids += 1
            request = self._ids
        message = pickle.dumps({"op": "fork", "id": request, "module": module, "env": dict(env),
                                "log": log, "fd_vars": list(fds)})
        self._send(message, list(fds.values()))
        with self._cond:
            self._cond.wait_for(lambda: request in self._replies or self._gone,
                                until.wait_time())
            reply = self._replies.pop(request, None)
            if reply is None:
                raise ZygoteUnavailable("the zygote did not fork in time" if not self._gone
                                        else "the zygote is gone")
            if reply["op"] != "forked":
                raise ZygoteUnavailable(f"the zygote could not fork: {reply['error']}")
            return reply["process"]

    def _send(self, message: bytes, fds: list[int]) -> None:
        try:
            with self._send_lock:
                socket.send_fds(self._socket, [message], fds)
        except OSError as error:
            self._lost()
            raise ZygoteUnavailable(f"the zygote is gone ({error.strerror})") from None

    def _read(self) -> None:
        while True:
            try:
                data = self._socket.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                self._lost()
                return
            message = pickle.loads(data)
            op = message["op"]
            with self._cond:
                if op == "ready":
                    self._ready = True
                elif op == "forked":  # kept in the reply too: its exit may come first
                    fork = ForkedProcess(message["pid"], self)
                    self._forks[message["pid"]] = fork
                    self._replies[message["id"]] = {**message, "process": fork}
                elif op == "fork_failed":
                    self._replies[message["id"]] = message
                elif op == "exit":
                    fork = self._forks.pop(message["pid"], None)
                    if fork is not None:
                        fork._ended(message["code"])
                self._cond.notify_all()
            if op == "ready":
                self._tell()
            if op == "exit":
                try:
                    self._send(pickle.dumps({"op": "release", "pid": message["pid"]}), [])
                except ZygoteUnavailable:
                    return

    def _lost(self) -> None:
        with self._cond:
            self._gone = True
            forks, self._forks = list(self._forks.values()), {}
            self._cond.notify_all()
        for fork in forks:  # they die with it (PR_SET_PDEATHSIG)
            fork._ended(LOST_CODE)
        self._tell()

    def _tell(self) -> None:
        """Call ``on_change`` from a thread of its own: the owner may take a lock that a
        caller of :meth:`fork` holds while it waits for this reader to read the reply."""
        threading.Thread(target=self._on_change, name="rankguard-zygote-change",
                         daemon=True).start()

    def close(self, until: Deadline) -> None:
        """Close its socket (it exits, and its ranks with it), kill it if it has not by
        ``until``, and reap it."""
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.proc.wait(until.wait_time_or_none())
        except Exception:  # noqa: BLE001 (subprocess.TimeoutExpired)
            self.proc.kill()
            self.proc.wait(5.0)
        self._socket.close()
