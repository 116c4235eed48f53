"""Waiting for processes to end, on pidfds: the kernel wakes the wait when one exits (a zombie
counts as ended), whoever its parent is. No polling."""

from __future__ import annotations

import os
import selectors
from collections.abc import Iterable

from ..deadline import Deadline
from .rank_processes import select_timeout


def wait_gone(pids: Iterable[int], until: Deadline) -> list[int]:
    """Wait until every process of ``pids`` has ended, or ``until`` passes; returns those still
    running then. Reaps none of them (their parent does)."""
    left: list[int] = []
    with selectors.DefaultSelector() as selector:
        try:
            for pid in pids:
                try:
                    selector.register(os.pidfd_open(pid), selectors.EVENT_READ, pid)
                except OSError:
                    continue  # gone already
            while selector.get_map() and not until.passed():
                for key, _ in selector.select(select_timeout(until.wait_time())):
                    selector.unregister(key.fd)
                    os.close(key.fd)
        finally:
            for key in list(selector.get_map().values()):
                left.append(key.data)
                os.close(key.fd)
    return sorted(left)
