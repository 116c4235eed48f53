"""A rank that asks its peers where they are (``probe.Asker.ask``, on a real TCPStore) stops
waiting for a peer as soon as it is known to be dead (its supervisor's notice), not at the end
of the answer window; without that news it waits the window out. ``regroup()`` takes a peer
its probe could not reach for a silent one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest

from rankguard.deadline import Deadline
from rankguard.runtime import generations, probe
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


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_a_peer_the_probe_could_not_reach_is_silent_to_regroup(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ask's requests are out, then the store's server stops (a frozen host, or a loaded
    machine's reads past the window's slack): the ask says the peers could not be asked (an
    empty dict), and ``regroup()`` must not take the peer for one that answered: it did, and a
    dead rank was kept as a member, the survivors waiting for it out their timeout (CI)."""
    from torch.distributed import TCPStore

    from .ranks import STORE_HOST, free_port

    monkeypatch.setenv(sealed.ENV, SECRET)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", STORE_HOST, str(port)])
    try:
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        watcher = store.clone()
        asker = probe.Asker(store)

        def stop_server_once_asked() -> None:
            deadline = time.monotonic() + 20
            while not watcher.check(["rankguard/probe/g0/1"]) and time.monotonic() < deadline:
                time.sleep(0.005)
            os.kill(server.pid, signal.SIGSTOP)

        stopper = threading.Thread(target=stop_server_once_asked, daemon=True)
        stopper.start()
        started = time.monotonic()
        assert generations.silent(asker, 0, 2, set(), Deadline.after(6.0)) == {1}
        assert time.monotonic() - started < 6.0 + 1.0  # within the regroup's limit
        assert "did not answer" in asker.last_problem, asker.last_problem
        stopper.join(20)
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait(10)
