"""A round's end through a real TCPStore: published once for every node, and the agent's own
requests bounded when the store's host is frozen (SIGSTOP)."""

from __future__ import annotations

import time

import pytest

from rankguard.deadline import Deadline
from rankguard.launcher.round_end import RoundChannel, RoundEnd
from rankguard.store_calls import StoreStalled
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


@pytest.mark.parametrize("request_name", ["publish", "done"])
def test_a_request_to_a_frozen_store_raises_within_its_bound(request_name):
    with store_process() as (server, port):
        channel = _channel(port)
        freeze(server.pid)
        started = time.monotonic()
        with pytest.raises(StoreStalled, match="did not answer by the deadline"):
            if request_name == "publish":
                channel.publish(RoundEnd(False, 0, "exited", 0, "rank 0 exited with code 1"))
            else:
                channel.done()
        took = time.monotonic() - started
        assert REQUEST_S <= took < REQUEST_S + SLACK_S, took
        channel.close()


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
