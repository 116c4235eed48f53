"""A TCPStore served by a process of its own, which a test can stop (SIGSTOP) as a frozen host."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any, Iterator

_SERVE = (
    "import time\n"
    "from datetime import timedelta\n"
    "from torch.distributed import TCPStore\n"
    "store = TCPStore('127.0.0.1', 0, is_master=True, timeout=timedelta(seconds=60))\n"
    "print(store.port, flush=True)\n"
    "time.sleep(120)\n")


@contextlib.contextmanager
def store_process() -> Iterator[tuple[subprocess.Popen, int]]:
    """(the serving process, its port); the process is killed on the way out, stopped or not."""
    server = subprocess.Popen([sys.executable, "-c", _SERVE], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        yield server, int(server.stdout.readline())
    finally:
        server.kill()
        server.wait(timeout=10)


def client(port: int, timeout_s: float = 30.0) -> Any:
    """Another client of the store at ``port``."""
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout_s))


def freeze(pid: int, within_s: float = 10.0) -> None:
    """SIGSTOP ``pid`` and return once every one of its threads is stopped: kill() returns
    before the group stop reaches them all, and a server thread still running could answer a
    request sent meanwhile."""
    os.kill(pid, signal.SIGSTOP)
    until = time.monotonic() + within_s
    while True:
        states = set()
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as stat:
                    states.add(stat.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                continue  # a thread that ended
        if states <= {"T"}:
            return
        assert time.monotonic() < until, f"the server's threads are not all stopped: {states}"
        time.sleep(0.01)  # the kernel stops them shortly; nothing signals it
