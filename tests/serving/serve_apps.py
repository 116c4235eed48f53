"""Services the serve tests run (``rankguard serve tests/serving/serve_apps.py:NAME``).

``sleeper``: each request ``{"sleep": S, "notify": PATH}`` has rank 0 tell the test, at the
Unix socket PATH, that the request is running on the ranks; every rank then sleeps S seconds.
The test waits for that connection (an event, not a guess) before it acts on the server.

``picky_app``: echoes ``n`` (as a set: ``"as": "set"``); its ``validate`` raises KeyError on a
request without ``n``.
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


def echo(state: Any, request: dict[str, Any]) -> Any:
    """``n``; a set of it (a result that is not JSON) when the request asks ``"as": "set"``."""
    return {request["n"]} if request.get("as") == "set" else request["n"]


def picky(request: dict[str, Any]) -> dict[str, Any]:
    """A validate with a bug: a request without ``n`` makes it raise KeyError, not the
    ValueError or TypeError that refuses a request."""
    if request["n"] is None:
        raise ValueError("'n' must not be null")
    return request


picky_app = rankguard.Service(handle=echo, validate=picky, world_size=2, spares=0, timeout=30.0)
