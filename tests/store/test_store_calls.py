"""Store calls bounded by a deadline, against a real TCPStore whose server is stopped by SIGSTOP."""

from __future__ import annotations

import time
from typing import Iterator

import pytest
from torch.distributed import TCPStore

from rankguard.deadline import Deadline
from rankguard.store import store_calls
from rankguard.store.store_calls import StoreStalled, within
from tests.leftover_threads import ends_its_threads
from tests.store_process import client, freeze, store_process

@pytest.fixture
def stopped_store() -> Iterator[TCPStore]:
    """A client of a store whose server process is stopped (SIGSTOP) once the client is in; the
    calls abandoned on it end once the server is gone."""
    with ends_its_threads(5.0), store_process() as (server, port):
        store = client(port)
        store.set("key", "value")
        freeze(server.pid)
        yield store


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


def test_what_stop_if_raises_ends_the_wait_at_once_and_the_call_is_abandoned(
        stopped_store: TCPStore) -> None:
    class Stop(Exception):
        pass

    asked_after = time.monotonic() + 0.3

    def stop_if() -> None:
        if time.monotonic() >= asked_after:
            raise Stop

    before = store_calls.abandoned()
    with pytest.raises(Stop):
        within(Deadline.after(30), "checking", lambda: stopped_store.check(["key"]),
               stop_if=stop_if)
    assert time.monotonic() - asked_after < 5  # not the 30 s deadline
    assert store_calls.abandoned() == before + 1


def test_stop_if_that_never_raises_changes_nothing(stopped_store: TCPStore) -> None:
    assert within(Deadline.after(5), "adding", lambda: 1 + 1, stop_if=lambda: None) == 2
    with pytest.raises(StoreStalled):
        within(Deadline.after(0.3), "checking", lambda: stopped_store.check(["key"]),
               stop_if=lambda: None)
