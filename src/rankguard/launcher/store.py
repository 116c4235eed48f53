"""The job's key-value store (a torch TCPStore), hosted by the launcher for all attempts.

The port is bound first, without torch, so that a port in use is reported before anything starts;
the listening socket is then handed to the TCPStore (``rankguard.store_server``, which keeps it on
the address asked for). Ranks connect as clients (``TORCHELASTIC_USE_AGENT_STORE``), and each
attempt works under its own key prefix (``store_keys.attempt_namespace``), so nothing an earlier attempt left behind
can meet a later one.
"""

from __future__ import annotations

import socket

from ..store import store_server
from ..store.store_server import host

__all__ = ["host", "reserve_port"]


def reserve_port(addr: str, port: int) -> socket.socket:
    """Bind and listen on ``addr:port`` (0: any free port).

    Raises:
        UsageError: the port is in use or the address cannot be bound here (naming
            ``--master-port`` or ``--master-addr``).
    """
    return store_server.reserve_port(addr, port, addr_option="--master-addr",
                                     port_option="--master-port")


