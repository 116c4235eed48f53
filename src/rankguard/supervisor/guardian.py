"""The guardian: a small process that outlives its owner (the launcher, a pool's leader) and ends
the processes the owner started, however the owner died.

``python -m rankguard.supervisor.guardian VAR TOKEN OWNER_PID [FOLDER...]``, started through
:class:`Guardian` in a session of its own with a pipe on its stdin. When the owner ends (its end
of the pipe closes, or the owner's process exits while a fork of it still holds the pipe), the
guardian kills every process marked ``VAR=TOKEN`` (its environment, or the run's cgroup: see
``proctree.with_marker``), sweeping a few times over ``SWEEP_S`` seconds to catch processes that
were starting, then removes the FOLDERs. An owner that finished its own teardown writes
``CLEAN_EXIT`` first (:meth:`Guardian.close`): then one sweep is enough. Without a guardian a
SIGKILL to torchrun leaves its ranks running (measured), and one to a pool's leader left the
zygote's forks and whatever the ranks started (a session of their own, a double fork).

While the owner runs it costs nothing: it is blocked in ``poll``.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from ..deadline import Deadline
from ..margins import GUARDIAN_EXIT_S, REAP_S
from ..processes.proctree import forget, kill_all, with_marker

SWEEP_S = 1.0
SWEEP_EVERY_S = 0.1
CLEAN_EXIT = b"done"


class Guardian:
    """A guardian process for the processes marked ``var=token``, seen from its owner (this
    process). It is started at once (a Python interpreter without torch: about 0.1 s of CPU)
    and never carries the marker itself, so the owner's own sweeps spare it.

    Args:
        var: the environment variable that marks the owner's processes.
        token: its value for this owner.
        folders: removed by the guardian once it has swept (the owner's temporary folders).
    """

    def __init__(self, var: str, token: str, folders: Sequence[str] = ()) -> None:
        env = {k: v for k, v in os.environ.items() if k != var}
        self._process: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", __name__, var, token, str(os.getpid()), *folders],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True, env=env)

    def close(self) -> None:
        """Tell the guardian that the owner's processes are ended: it sweeps once, removes
        its folders and exits. Waits ``margins.GUARDIAN_EXIT_S`` for that, then kills it.
        Idempotent; raises nothing."""
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None
        try:
            process.stdin.write(CLEAN_EXIT)
            process.stdin.close()
        except OSError:
            pass
        try:
            process.wait(timeout=GUARDIAN_EXIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            try:
                process.wait(timeout=REAP_S)
            except subprocess.TimeoutExpired:
                pass


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    var, token, owner, *folders = sys.argv[1:]
    clean = _wait_for_owner(int(owner))
    end = Deadline.after(0.0 if clean else SWEEP_S)
    while True:
        kill_all(with_marker(token, var))
        if end.passed():
            forget(token)  # the run's cgroup, empty now (a launcher that ended removed it)
            break
        time.sleep(SWEEP_EVERY_S)  # not a wait for anything: the pace of the sweeps
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _wait_for_owner(owner: int) -> bool:
    """Until the owner closes its end of stdin or its process exits (no deadline: that is
    this process's whole job); whether it wrote ``CLEAN_EXIT`` before."""
    os.set_blocking(0, False)
    poller = select.poll()
    poller.register(0, select.POLLIN)
    try:
        poller.register(os.pidfd_open(owner), select.POLLIN)
    except (OSError, AttributeError):  # gone already (see below), or no pidfd: the pipe alone
        pass
    received = b""
    while True:
        # this process is the owner's child until the owner exits (then it is reparented,
        # before the pidfd says so): that also tells of an owner gone before its pidfd was had
        if os.getppid() == owner:
            poller.poll()
        try:
            while chunk := os.read(0, 4096):
                received += chunk
            return received.endswith(CLEAN_EXIT)  # the pipe closed
        except BlockingIOError:  # open still: a fork of the owner may hold it
            if os.getppid() != owner:
                return received.endswith(CLEAN_EXIT)


if __name__ == "__main__":
    main()
