"""A round's own store, hosted by the round's node 0, when the job's store is etcd.

With ``--rdzv-backend etcd-v2`` the job's store is an etcd server outside the nodes: it holds
torch's rendezvous state and the job-wide keys, and outlives every node. A round's fast traffic
does not go there (a beat per node every second, the round's end, and the ranks' own keys,
which torch's process groups read and write through a TCPStore): node 0 of each round hosts a
TCPStore for it, listening on this node's address only (``store_server``), and names it in the
round's plan. When that node is lost, so is the round's store: the other nodes end the round
naming node 0, and the next round forms through etcd with another host. Losing a node therefore
ends a round, never the job.
"""

from __future__ import annotations

import socket
from typing import Any

from ..store import store_server
from ..errors import UsageError
from .config import RendezvousConfig


def own_address(cfg: RendezvousConfig) -> str:
    """The address the other nodes reach this one at: ``--local-addr`` if given, else the
    address of this machine's interface on the way to the job's store (with nodes on one
    machine and etcd on loopback: 127.0.0.1).

    Raises:
        UsageError: no route to the job's store's address (naming ``--local-addr``).
    """
    if cfg.local_addr:
        return cfg.local_addr
    try:
        family = socket.getaddrinfo(cfg.host, cfg.port, type=socket.SOCK_DGRAM)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((cfg.host, cfg.port))  # UDP: picks the route, sends nothing
            return str(probe.getsockname()[0])
    except OSError as exc:
        raise UsageError("--local-addr", f"cannot find this node's address towards "
                         f"{cfg.endpoint}: {exc.strerror or exc}",
                         "give the address other nodes reach this one at") from None


def host_round_store(cfg: RendezvousConfig) -> tuple[Any, str, int]:
    """A TCPStore for one round, on a free port of this node's address (:func:`own_address`);
    returns ``(store, host, port)``. Its requests time out after ``read_timeout``.

    Raises:
        UsageError: the address cannot be bound here.
    """
    addr = own_address(cfg)
    sock = store_server.reserve_port(addr, 0, addr_option="--local-addr",
                                     port_option="--local-addr")
    port = sock.getsockname()[1]
    return store_server.host(sock, addr, cfg.read_timeout), addr, port
