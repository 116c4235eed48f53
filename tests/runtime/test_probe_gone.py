"""A rank that asks its peers where they are (``probe.Asker.ask``, on a real TCPStore) stops
waiting for a peer as soon as it is known to be dead (its supervisor's notice), not at the end
of the answer window; without that news it waits the window out."""

from __future__ import annotations

import threading
import time

import pytest

from rankguard.runtime import probe
from rankguard.store import sealed

SECRET = "7c" * 32


@pytest.fixture
def asker(monkeypatch: pytest.MonkeyPatch) -> probe.Asker:
    from torch.distributed import TCPStore

    monkeypatch.setenv(sealed.ENV, SECRET)
    return probe.Asker(TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False))


def test_a_peer_reported_dead_is_not_waited_for(asker: probe.Asker) -> None:
    dead = threading.Event()
    threading.Timer(0.3, dead.set).start()  # the notice comes while the rank waits
    started = time.monotonic()
    assert asker.ask("world", [1], window=10.0, gone=lambda peer: dead.is_set()) == {1: None}
    assert time.monotonic() - started < 5.0  # about 0.3 s, not the 10 s window


def test_without_news_of_its_death_a_silent_peer_is_waited_for_the_whole_window(
        asker: probe.Asker) -> None:
    started = time.monotonic()
    assert asker.ask("world", [1], window=0.4, gone=lambda peer: peer == 2) == {1: None}
    assert time.monotonic() - started >= 0.4
