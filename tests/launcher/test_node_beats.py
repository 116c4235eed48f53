"""Hearing the other nodes: the silence rules as tables, then real beats through a real TCPStore
(a node that stops beating, a store whose server is stopped)."""

from __future__ import annotations

import math
import time

import pytest

from tests.store_process import client, freeze, store_process

from rankguard.launcher.node_beats import (Heard, NodeBeats, Silence, all_alive_after,
                                           quiet_since, silence)

LIMIT = 3.0
PERIOD = 0.1  # of the real beats


@pytest.mark.parametrize("heard, last, pending, now, expected", [
    # every node heard recently: nobody is silent
    ({1: Heard(b"a", 9.0), 2: Heard(b"b", 9.5)}, 10.0, None, 10.1, None),
    # node 2's beat was seen unchanged across 3 s of our exchanges
    ({1: Heard(b"a", 9.0), 2: Heard(b"b", 7.0)}, 10.0, None, 10.1, Silence(2, 3.0)),
    # the longest silence is named
    ({1: Heard(b"a", 6.0), 2: Heard(b"b", 7.0)}, 10.0, None, 10.1, Silence(1, 4.0)),
    # our exchanges stopped (we were stopped ourselves): no evidence past the last one
    ({1: Heard(b"a", 9.0)}, 10.0, None, 60.0, None),
    # a request outstanding for the limit: the store is silent, before any node is judged
    ({1: Heard(b"a", 1.0)}, 10.0, 7.0, 10.0, Silence(None, 3.0)),
    ({1: Heard(b"a", 9.0)}, 10.0, 8.0, 10.0, None),
    # a node never heard is silent from the start of the round
    ({1: Heard(None, 5.0)}, 8.5, None, 8.6, Silence(1, 3.5)),
])
def test_silence_rests_on_our_completed_exchanges(heard, last, pending, now, expected):
    assert silence(heard, last, pending, now, LIMIT) == expected


@pytest.mark.parametrize("heard, since, last, expected", [
    # node 1 published after the fault (its beat changed across two of our reads): alive
    ({1: Heard(b"a", 9.0, alive_after=10.5)}, 10.0, 12.5, None),
    # node 1's beat has not changed for 3.5 s and nothing proves a publication since: gone
    ({1: Heard(b"a", 9.0, alive_after=8.0), 2: Heard(b"b", 12.0, alive_after=11.0)}, 10.0,
     12.5, Silence(1, 3.5)),
    # its value was first seen after the fault but may have been written before it: once it
    # has stayed unchanged for 2 s, it is gone all the same
    ({1: Heard(b"a", 10.25, alive_after=9.0)}, 10.0, 12.5, Silence(1, 2.25)),
    # unchanged for less than 2 s: no evidence yet
    ({1: Heard(b"a", 10.25, alive_after=9.0)}, 10.0, 11.5, None),
])
def test_a_node_quiet_since_a_broken_collective_is_told_after_two_beats(heard, since, last,
                                                                        expected):
    assert quiet_since(heard, since, last, 2.0) == expected


@pytest.mark.parametrize("after, expected", [
    ((10.5, 11.0), True), ((10.5, 9.9), False), ((-math.inf, 11.0), False)])
def test_nodes_are_alive_after_a_fault_only_when_each_changed_its_beat_across_two_reads(
        after, expected):
    heard = {n: Heard(b"x", 12.0, alive_after=a) for n, a in enumerate(after, 1)}
    assert all_alive_after(heard, 10.0) is expected


@pytest.mark.slow  # moved out of the README's 5-minute run; the rules are table-tested
def test_the_silent_node_and_a_stopped_store_are_told_apart_through_a_real_store(tmp_path):
    """Two nodes beat through a TCPStore served by another process; node 1 stops beating, then
    the store's server is stopped (SIGSTOP): node 0 names node 1, then the store, each after
    the limit, and its event loop never blocks on the store."""
    limit = 1.5
    with store_process() as (server, port):

        def connect():
            return client(port)

        beats = [NodeBeats(connect, "/t/", node, 2, PERIOD, f"h{node}") for node in (0, 1)]
        try:
            settle = time.monotonic() + 20  # a loaded machine starts threads late
            while beats[0].exchanges < 5 or beats[1].exchanges < 5:
                assert time.monotonic() < settle, "the beats did not start"
                time.sleep(0.05)
            assert beats[0].silence(time.monotonic(), limit) is None
            beats[1].close()
            stopped = time.monotonic()
            heard = _await_silence(beats[0], limit, stopped + limit + 5)
            assert heard.node == 1 and heard.host == "h1"
            # silence counts from when node 1's last beat was first seen: up to a period earlier
            assert limit - PERIOD - 0.05 <= time.monotonic() - stopped < limit + 3
            assert limit <= heard.silent_s < limit + 1

            freeze(server.pid)
            frozen = time.monotonic()
            while True:  # node 1's silence stands until the store's own is established
                asked = time.monotonic()
                heard = beats[0].silence(asked, limit)
                assert time.monotonic() - asked < 0.1, "asking must never wait for the store"
                if heard is not None and heard.node is None:
                    break
                assert asked < frozen + limit + 5, heard
                time.sleep(0.05)
            # counted from the start of the request still outstanding: it may predate the stop
            assert limit - PERIOD - 0.05 <= time.monotonic() - frozen < limit + 3
            assert "has not answered for" in heard.describe("the job's store at 127.0.0.1:1")
        finally:
            for beat in beats:
                beat.close()


def _await_silence(beats: NodeBeats, limit: float, until: float) -> Silence:
    while True:
        heard = beats.silence(time.monotonic(), limit)
        if heard is not None:
            return heard
        assert time.monotonic() < until, "no silence seen in time"
        time.sleep(0.05)


def test_a_beat_without_the_jobs_seal_is_no_sign_of_life(monkeypatch):
    """With a shared secret, values written to node 1's key by a process without it (forged,
    changing every time) do not keep node 1 alive: node 0 names it silent after the limit."""
    monkeypatch.setenv("RANKGUARD_SECRET", "cd" * 32)
    limit = 1.0
    with store_process() as (_, port):
        beats = NodeBeats(lambda: client(port), "/t/", 0, 2, PERIOD, "h0")
        forger = client(port)
        try:
            started = time.monotonic()
            heard = None
            while heard is None:
                forger.set("/t/beat1", f'-.{{"seq":{time.monotonic_ns()},"host":"h1","ranks":[]}}')
                heard = beats.silence(time.monotonic(), limit)
                assert time.monotonic() < started + limit + 5, "node 1 was never found silent"
                time.sleep(PERIOD / 2)
            assert heard.node == 1 and heard.host == ""  # never heard: no host either
            assert beats.heard() == {}
        finally:
            beats.close()
