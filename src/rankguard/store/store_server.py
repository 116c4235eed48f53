"""Hosting a torch TCPStore that listens only where we say.

torch's TCPStore server ignores the host it is given: ``TCPStore("127.0.0.1", 0,
is_master=True)`` listens on every interface, so anyone who can reach the machine could write
keys that ranks act on. Here the listening socket is bound first, without torch, on the address
asked for, and handed to the store (``master_listen_fd``), which then owns it. The launcher
(``rankguard run``'s job store) and the pool's groups (``rankguard.Pool``, ``rankguard serve``,
the pytest plugin's warm ranks) both host their stores this way.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from datetime import timedelta
from typing import Any

from ..errors import UsageError

LOOPBACK = "127.0.0.1"


def reserve_port(addr: str, port: int, *, addr_option: str, port_option: str,
                 any_port: bool = True) -> socket.socket:
    """A socket bound and listening on ``addr:port`` (port 0: any free port).

    ``addr_option`` and ``port_option`` name the settings the address and the port came from,
    for the error; ``any_port``: whether port 0 (any free one) is a fix to suggest there.

    Raises:
        UsageError: the address cannot be resolved or bound here, or the port is in use.
    """
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_NUMERICSERV)
    except socket.gaierror as exc:
        raise UsageError(addr_option, f"cannot resolve {addr!r}: {exc.strerror}",
                         "use an IP address of this machine, e.g. 127.0.0.1") from None
    family, _, _, _, sockaddr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(sockaddr)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(port_option, f"port {port} on {addr} is already in use",
                             f"pick a free port, or {port_option} 0 for any free one"
                             if any_port else "pick a free port (the same on every node)"
                             ) from None
        raise UsageError(addr_option, f"cannot listen on {addr}:{port}: {exc.strerror}",
                         "use an address of this machine") from None
    return sock


def host(sock: socket.socket, addr: str, timeout_s: float = 1800.0) -> Any:
    """Start a TCPStore server on ``sock`` (from :func:`reserve_port`); imports torch (about
    2 s the first time). The store takes the socket over: ``sock`` is detached and the store
    closes the listening socket when it is destroyed (or this function does, when an exception
    ends it, a signal handler's included: nothing closes it twice). ``timeout_s`` bounds the
    store's own waits (its ``get`` and ``wait``)."""
    port = sock.getsockname()[1]
    fd = sock.detach()
    try:
        from torch.distributed import TCPStore

        return TCPStore(addr, port, is_master=True, master_listen_fd=fd,
                        wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
    except BaseException:
        with contextlib.suppress(OSError):  # the store's, if it took the socket over
            os.close(fd)
        raise


def host_on_loopback(timeout_s: float) -> Any:
    """A TCPStore server on a free port of 127.0.0.1 only (its ``port`` says which).

    Raises:
        UsageError: no port could be bound on loopback.
    """
    sock = reserve_port(LOOPBACK, 0, addr_option="store", port_option="store")
    return host(sock, LOOPBACK, timeout_s)
