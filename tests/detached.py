"""Processes that leave a job or a test the hard way (``setsid env -i``, orphaned by a double
fork), and the two ways ``proctree.Tracking`` still holds them, as test parameters."""

from __future__ import annotations

import os
import time

import pytest

from rankguard.processes import proctree

from .conftest import script

DAEMON = script("detached_daemon.py")  # argv: PIDFILE [SECONDS]

CGROUP = pytest.param(
    {}, id="cgroup", marks=pytest.mark.skipif(
        not os.access(proctree.own_cgroup() or "/nonexistent", os.W_OK),
        reason="no writable cgroup v2 hierarchy here"))
SUBREAPER = pytest.param({proctree.NO_CGROUP: "1"}, id="subreaper")


def gone_within(pid: int, timeout: float) -> bool:
    """Whether ``pid`` ends (or is a zombie) within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while proctree.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not proctree.alive(pid)
