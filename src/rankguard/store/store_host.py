"""Whether this process hosts the server of a TCPStore (rank 0's under ``mp.spawn`` or plain
``env://``): its server ends when the process exits, and every client blocked on it then (a
peer's probe responder) fails, and torch prints a C++ warning with a stack dump for each.

torch does not say which process hosts a store, and where it does depends on the launcher
(torchrun's agent, rank 0, a store the user made), so it is read from the kernel: a listening
TCP socket on the store's port that this process holds. Linux only; elsewhere the answer is
False (nothing is done that depends on it).
"""

from __future__ import annotations

import os
from typing import Any

_LISTEN = "0A"  # the TCP state of a listening socket in /proc/net/tcp


def hosts_server(store: Any) -> bool:
    """Whether this process holds the listening socket of ``store``'s TCPStore server
    (``store`` may be a PrefixStore around it). False for any other kind of store."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    port = getattr(store, "port", None)
    if not isinstance(port, int) or port <= 0:
        return False
    return bool(_listening_inodes(port) & _own_socket_inodes())


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                next(rows, None)
                for row in rows:
                    fields = row.split()
                    if fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(fields[9])
        except (OSError, IndexError, ValueError):
            continue
    return inodes


def _own_socket_inodes() -> set[str]:
    inodes = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes
