"""A zygote: ``python -m rankguard.supervisor.zygote_main FD LEADER_PID MODULE...``.

It imports MODULEs (torch and a rank's entry module: the seconds a rank spends starting) once,
then forks a rank each time its leader asks, on the socket FD (``supervisor.zygote`` is the
leader's side). A fork of it is a rank that has imported everything already: it starts in
milliseconds instead of seconds, and shares the zygote's pages until it writes them.

Single-threaded on purpose (a fork copies only the thread that forks; a lock another thread
held would stay locked in the child): one loop over the socket and the SIGCHLD wakeup fd.

Messages (pickled, one per SOCK_SEQPACKET packet; the socket is a private socketpair):

- from the leader: ``{"op": "fork", "id", "module", "env", "log", "fd_vars"}`` with the
  descriptors named by ``fd_vars`` passed alongside (SCM_RIGHTS): fork a rank that runs
  ``module.main()`` in a session of its own, with ``env`` as its environment (each variable
  of ``fd_vars`` naming the descriptor it received), its output appended to ``log``;
  ``{"op": "release", "pid"}``: reap that exited rank.
- to the leader: ``{"op": "ready", "pid"}`` once imported; ``{"op": "forked", "id", "pid"}``
  or ``{"op": "fork_failed", "id", "error"}``; ``{"op": "exit", "pid", "code"}`` when a rank
  exited (``code`` as Popen's returncode). An exited rank stays a zombie until released, so
  that its pid names the same process until the leader is done with it.

The zygote dies with its leader (PR_SET_PDEATHSIG), and its ranks with it; it exits when its
socket closes.
"""

from __future__ import annotations

import importlib
import os
import pickle
import random
import select
import signal
import socket
import sys
import traceback
from typing import Any

from ..processes import proctree

MAX_MESSAGE = 1 << 20
MAX_FDS = 16


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.send(pickle.dumps(message))


def _become(message: dict[str, Any], fds: list[int], leader: socket.socket,
            wakeup: tuple[int, int], zygote: int) -> None:
    """In the forked child: become the rank ``message`` describes; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        leader.close()
        for fd in wakeup:
            os.close(fd)
        os.setsid()
        proctree.die_with_parent(zygote)
        out = os.open(message["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                      0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(null)
        env = dict(message["env"])
        for name, fd in zip(message["fd_vars"], fds):
            env[name] = str(fd)
        os.environ.clear()
        os.environ.update(env)
        random.seed()  # the zygote's state is every fork's: draw a new one
        module = importlib.import_module(message["module"])
        sys.argv = [getattr(module, "__file__", None) or message["module"]]  # as with -m
        module.main()
        code = 0
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    except BaseException:  # noqa: BLE001 (a rank's crash: in its log, and its exit code)
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 (an output that cannot take more)
                pass
        os._exit(code)


def _returncode(status: os.waitid_result) -> int:
    if status.si_code == os.CLD_EXITED:
        return status.si_status
    return -status.si_status  # killed or dumped: the signal, as Popen says it


def main() -> None:
    leader = socket.socket(fileno=int(sys.argv[1]))
    zygote = os.getpid()
    proctree.die_with_parent(int(sys.argv[2]))
    for name in sys.argv[3:]:
        importlib.import_module(name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    children: dict[int, bool] = {}  # pid -> whether its exit was reported
    _send(leader, {"op": "ready", "pid": zygote})
    while True:
        readable, _, _ = select.select([leader, wake_r], [], [])
        if wake_r in readable:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        for pid, reported in list(children.items()):
            if reported:
                continue
            status = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if status is not None and status.si_pid == pid:
                children[pid] = True
                _send(leader, {"op": "exit", "pid": pid, "code": _returncode(status)})
        if leader not in readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(leader, MAX_MESSAGE, MAX_FDS)
        except OSError:
            data, fds = b"", []
        if not data:
            os._exit(0)  # the leader is gone: so are we, and (PR_SET_PDEATHSIG) our ranks
        message = pickle.loads(data)
        if message["op"] == "release":
            if children.pop(message["pid"], None) is not None:
                os.waitpid(message["pid"], 0)  # a zombie already: at once
            continue
        try:
            pid = os.fork()
        except OSError as error:
            _send(leader, {"op": "fork_failed", "id": message["id"], "error": str(error)})
            pid = -1
        if pid == 0:
            _become(message, fds, leader, (wake_r, wake_w), zygote)
        for fd in fds:
            os.close(fd)
        if pid > 0:
            children[pid] = False
            _send(leader, {"op": "forked", "id": message["id"], "pid": pid})


if __name__ == "__main__":
    main()
