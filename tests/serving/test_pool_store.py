"""A pool's store (the TCPStore its ranks rendezvous through, hosted in the leader) listens on
loopback only: nothing from another machine can reach it, let alone write to it."""

from __future__ import annotations

import socket

import psutil
import pytest

import rankguard

from . import rank_functions as rf


def non_loopback_addresses() -> list[tuple[int, str]]:
    """(family, address) of this machine's addresses that are not loopback nor link-local."""
    found = []
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                found.append((a.family, a.address))
            elif (a.family == socket.AF_INET6 and a.address != "::1"
                  and not a.address.startswith("fe80")):
                found.append((a.family, a.address))
    return found


def test_the_pool_store_listens_on_loopback_only_and_is_refused_from_other_addresses() -> None:
    outside = non_loopback_addresses()
    if not outside:
        pytest.skip("this machine has no address but loopback to connect from")
    with rankguard.Pool(1, spares=0, timeout=10) as pool:
        port = pool.run(rf.master_port)
        listening = [c for c in psutil.Process().net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        assert listening, f"the leader does not listen on the store's port {port}"
        assert {c.laddr.ip for c in listening} == {"127.0.0.1"}, listening
        for family, address in outside:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.settimeout(5)
                with pytest.raises(ConnectionRefusedError):
                    probe.connect((address, port))
        assert pool.run(rf.master_port) == port  # the store still serves its ranks
