"""Services the serve tests run (``rankguard serve tests/serving/serve_apps.py:NAME``).

``sleeper``: each request ``{"sleep": S, "notify": PATH}`` has rank 0 tell the test, at the
Unix socket PATH, that the request is running on the ranks; every rank then sleeps S seconds.
The test waits for that connection (an event, not a guess) before it acts on the server.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import rankguard


def sleep(state: Any, request: dict[str, Any]) -> str:
    import torch.distributed as dist

    if dist.get_rank() == 0 and request.get("notify"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(request["notify"])
            sock.sendall(b"running")
    time.sleep(float(request.get("sleep", 0)))
    return "slept"


sleeper = rankguard.Service(handle=sleep, world_size=2, spares=0, timeout=30.0)
