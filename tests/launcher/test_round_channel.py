"""A round's end through a real TCPStore: published once for every node, and the agent's own
requests bounded when the store's host is frozen (SIGSTOP)."""

from __future__ import annotations

import time

import pytest

from rankguard.records import ledger as L
from rankguard.deadline import Deadline
from rankguard.launcher.monitor import Verdict
from rankguard.launcher.outcome import Fault, notice_kind
from rankguard.launcher.round_end import RoundChannel, RoundEnd
from rankguard.store.store_calls import StoreStalled
from tests.leftover_threads import ends_its_threads
from tests.store_process import client, freeze, store_process

REQUEST_S = 1.0
SLACK_S = 5.0  # a loaded 2-core machine's scheduling delays, on top of a bound


def _channel(port: int, nodes: int = 2) -> RoundChannel:
    return RoundChannel(client(port), lambda: client(port), "/t/round0.agents/", nodes,
                        f"the job's store at 127.0.0.1:{port}", lambda: None, REQUEST_S)


def test_the_first_fault_stands_and_the_last_node_done_ends_the_round_ok():
    with store_process() as (_, port):
        first, second = _channel(port), _channel(port)
        fault = RoundEnd(False, 1, "exited", 3, "rank 3 exited with code 1")
        assert first.publish(fault) == fault
        later = RoundEnd(False, 0, "exited", 0, "rank 0 exited with code 1")
        assert second.publish(later) == fault  # the earlier one stands, on every node
        assert second.wait(Deadline.after(SLACK_S)) == fault
        first.close()
        second.close()

        # a new round's prefix: the one above has ended
        ok = [RoundChannel(client(port), lambda: client(port), "/t/round1.agents/", 2,
                           f"the job's store at 127.0.0.1:{port}", lambda: None, REQUEST_S) for _ in range(2)]
        ok[0].done()
        assert ok[0].end is None  # one node of two is done
        ok[1].done()
        assert ok[0].wait(Deadline.after(SLACK_S)) == RoundEnd(True)
        for channel in ok:
            channel.close()


@pytest.mark.parametrize("request_name", [
    "publish", pytest.param("done", marks=pytest.mark.slow)])  # done: out of the quick run
def test_a_request_to_a_frozen_store_raises_within_its_bound_and_leaves_no_thread_behind(
        request_name):
    """The channel is made once the store is frozen: its watcher connects to a store that never
    answers, the worst case for its client. The request given up and the watcher both end once
    the store's host is gone, within their clients' timeout, as the agent's (``read_timeout``)."""
    with ends_its_threads(REQUEST_S + SLACK_S), store_process() as (server, port):
        store = client(port, REQUEST_S)
        freeze(server.pid)
        channel = RoundChannel(store, lambda: client(port, REQUEST_S), "/t/round0.agents/", 2,
                               f"the job's store at 127.0.0.1:{port}", lambda: None, REQUEST_S)
        started = time.monotonic()
        with pytest.raises(StoreStalled, match="did not answer by the deadline"):
            if request_name == "publish":
                channel.publish(RoundEnd(False, 0, "exited", 0, "rank 0 exited with code 1"))
            else:
                channel.done()
        took = time.monotonic() - started
        assert REQUEST_S <= took < REQUEST_S + SLACK_S, took
        channel.close()


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_an_end_without_the_jobs_seal_ends_the_round_as_a_fault_that_names_it(monkeypatch):
    monkeypatch.setenv("RANKGUARD_SECRET", "ab" * 32)  # the nodes share one
    with store_process() as (_, port):
        forged = RoundEnd(True)  # "ok", written by a process without the secret
        client(port).set("/t/round0.agents/end", "-." + forged.encode())
        channel = _channel(port)
        end = channel.wait(Deadline.after(SLACK_S))
        assert end is not None and not end.ok and end.kind == "store_lost"
        assert "without this job's seal" in end.detail and "RANKGUARD_SECRET" in end.detail
        assert channel.publish(RoundEnd(False, 0, "exited", 0, "x")) == end  # it stands
        channel.close()


def test_another_nodes_hang_arrives_with_its_verdict_and_the_moment_it_began():
    """The end record carries the verdict (every node journals it and tells its ranks who hung)
    and when the fault happened: another node times its detection from the fault, not from
    when it heard of it."""
    verdict = Verdict(True, (3,), (0, 1, 2), "all_reduce", 22, 3.1, "stopped",
                      elsewhere=((3, "all_reduce #21"),))
    now = time.monotonic()
    began = now - 3.1
    record = RoundEnd.of(Fault("hung", began, None, "hang: " + verdict.describe(),
                               verdict=verdict), node=1)
    heard = RoundEnd.decode(record.encode()).fault(now + 0.5)  # heard half a second later
    assert heard.verdict == verdict
    assert heard.at == pytest.approx(began, abs=0.01)
    assert notice_kind(heard) == L.NOTICE_HUNG
    assert heard.describe().endswith("(node 1)")
    # a record whose verdict is not one keeps the fault, without a verdict
    bad = RoundEnd.decode(record.encode().replace('"reason": "stopped"', '"reason": 7'))
    assert bad.kind == "hung" and bad.fault(now).verdict is None
    # a moment on another machine's clock that is ahead of ours is never taken for a future
    ahead = RoundEnd(False, 1, "exited", 3, "exited with code 1", at_wall=time.time() + 60)
    assert ahead.fault(now).at == now
    # an older agent's record, with neither field, is heard now
    old = RoundEnd.decode('{"ok": false, "node": 1, "kind": "exited", "rank": 3}')
    assert old.fault(now).at == now and old.fault(now).verdict is None
