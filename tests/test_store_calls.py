"""Store calls bounded by a deadline, against a real TCPStore whose server is stopped by SIGSTOP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from typing import Iterator

import pytest
from torch.distributed import TCPStore

from rankguard.deadline import Deadline
from rankguard import store_calls
from rankguard.store_calls import StoreStalled, within

# The server takes a port of its own (0) and says which: a port chosen before it binds can be
# taken meanwhile by another test's store, whose answers would then reach our client.
SERVER = ("import sys, time; from torch.distributed import TCPStore; "
          "s = TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False); "
          "print(s.port, flush=True); time.sleep(120)")


@pytest.fixture
def stopped_store() -> Iterator[TCPStore]:
    """A client of a store whose server process is stopped (SIGSTOP) once the client is in."""
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        client.set("key", "value")
        os.kill(server.pid, signal.SIGSTOP)
        _await_stopped(server.pid, Deadline.after(10))
        yield client
    finally:
        server.kill()
        server.wait(10)


def _await_stopped(pid: int, until: Deadline) -> None:
    """Return once every thread of ``pid`` is stopped: kill() returns before the group stop
    reaches them all, and a server thread woken meanwhile could still answer a request."""
    while True:
        states = set()
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as stat:
                    states.add(stat.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                continue  # a thread that ended
        if states <= {"T"}:
            return
        assert not until.passed(), f"the server's threads are not all stopped: {states}"
        time.sleep(0.01)


def test_a_call_that_returns_in_time_gives_its_value_and_its_errors_as_they_are() -> None:
    assert within(Deadline.after(5), "adding", lambda: 1 + 1) == 2
    with pytest.raises(KeyError):
        within(Deadline.after(5), "reading", lambda: {}["missing"])


def test_a_call_on_a_stopped_server_is_abandoned_at_the_deadline(stopped_store: TCPStore
                                                                 ) -> None:
    started = time.monotonic()
    with pytest.raises(StoreStalled, match="checking: the store did not answer"):
        within(Deadline.after(0.5), "checking", lambda: stopped_store.check(["key"]))
    took = time.monotonic() - started
    assert 0.5 <= took < 0.5 + 1.0, took  # the deadline, plus a thread's start under load
    assert store_calls.abandoned() >= 1


def test_past_the_cap_of_abandoned_calls_a_call_is_refused_at_once(
        stopped_store: TCPStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_calls, "MAX_ABANDONED", store_calls.abandoned() + 1)
    with pytest.raises(StoreStalled):
        within(Deadline.after(0.2), "checking", lambda: stopped_store.check(["key"]))
    started = time.monotonic()
    with pytest.raises(StoreStalled, match="not tried"):
        within(Deadline.after(5), "checking", lambda: stopped_store.check(["key"]))
    assert time.monotonic() - started < 0.5
