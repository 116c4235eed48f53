"""The job's key-value store (a torch TCPStore), hosted by the launcher for all attempts.

The port is bound first, without torch, so that a port in use is reported before anything starts;
the listening socket is then handed to the TCPStore. Ranks connect as clients
(``TORCHELASTIC_USE_AGENT_STORE``), and each attempt works under its own key prefix
(``namespace``), so nothing an earlier attempt left behind can meet a later one.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

from ..errors import UsageError


def reserve_port(addr: str, port: int) -> socket.socket:
    """Bind and listen on ``addr:port`` (0: any free port).

    Raises:
        UsageError: the port is in use or the address cannot be bound here.
    """
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_NUMERICSERV)
    except socket.gaierror as exc:
        raise UsageError("--master-addr", f"cannot resolve {addr!r}: {exc.strerror}",
                         "use an IP address of this machine, e.g. 127.0.0.1") from None
    family, _, _, _, sockaddr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(sockaddr)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        if exc.errno == 98:  # EADDRINUSE
            raise UsageError("--master-port", f"port {port} on {addr} is already in use",
                             "pick a free port, or --master-port 0 for any free one") from None
        raise UsageError("--master-addr", f"cannot listen on {addr}:{port}: {exc.strerror}",
                         "use an address of this machine") from None
    return sock


def namespace(run_id: str, attempt: int) -> str:
    """The key prefix of one attempt of one run."""
    return f"/rankguard/{run_id}/attempt{attempt}/"


def host(sock: socket.socket, addr: str, timeout_s: float = 1800.0) -> Any:
    """Start the TCPStore server on the reserved socket (imports torch: about 2 s)."""
    from torch.distributed import TCPStore

    port = sock.getsockname()[1]
    return TCPStore(addr, port, is_master=True, master_listen_fd=sock.fileno(),
                    wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
