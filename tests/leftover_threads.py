"""A test's threads end with it: none of the threads started inside a block outlives it.

A thread left blocked in torch's store client (an abandoned store call, a round watcher, a store
check) fails once the test's store or listener is gone, and torch then logs from C++, with a
stack of ``frame #N`` lines, straight to the process's stderr: after the test, pytest no longer
captures it, and it lands in the middle of the test run's output. A test that leaves such a
thread lets the store go inside this block, and the block waits, bounded, until the thread has
ended, so that whatever it logs is the test's own captured output.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from rankguard.deadline import Deadline


@contextlib.contextmanager
def ends_its_threads(within_s: float) -> Iterator[None]:
    """Fail unless every thread started inside the block has ended ``within_s`` seconds after
    it, each one's name in the message."""
    before = set(threading.enumerate())
    yield
    limit = Deadline.after(within_s)
    for thread in set(threading.enumerate()) - before:
        thread.join(limit.wait_time_or_none())
    alive = sorted(t.name for t in set(threading.enumerate()) - before if t.is_alive())
    assert not alive, f"threads still running {within_s:g} s after the block: {alive}"
