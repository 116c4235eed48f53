"""A TCPStore served by a process of its own, which a test can stop (SIGSTOP) as a frozen host."""

from __future__ import annotations

import contextlib
import subprocess
import sys
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
