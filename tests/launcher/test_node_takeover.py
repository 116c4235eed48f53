"""A standby node's requests (``node_takeover``) through a real TCPStore: a request is taken by
one standby only, a survivor's second ask for the same node writes nothing, and what a process
without the job's secret writes is never acted on. The whole takeover, with three agents, is in
``test_multinode.py`` (slow)."""

from __future__ import annotations

import itertools

import pytest

from tests.store_process import client, store_process

from rankguard.launcher.node_takeover import Takeover, ask, stand_by, standbys, take

_ROUNDS = itertools.count()


def _request(node: int = 1, nodes: int = 2, world: int = 4) -> Takeover:
    return Takeover(0, node, nodes, 2 * node, world, "127.0.0.1", 1234, "node 1 is silent",
                    1700000000.0)


@pytest.fixture(scope="module")
def port():
    with store_process() as (_, port):
        yield port


@pytest.fixture
def store(monkeypatch, port):
    """A survivor's and a standby's clients, and a round's prefix of its own."""
    monkeypatch.setenv("RANKGUARD_SECRET", "ab" * 32)
    return client(port), client(port), f"/rankguard/t/round{next(_ROUNDS)}.agents/"


def test_a_request_is_taken_by_one_standby_only_and_asked_once_per_node(store):
    survivor, standby, prefix = store
    assert standbys(survivor, prefix) == 0
    stand_by(standby, prefix)
    stand_by(standby, prefix)
    assert standbys(survivor, prefix) == 2
    assert take(standby, prefix, 0, 2) == (None, 0)  # nothing asked yet
    assert ask(survivor, prefix, _request())
    assert not ask(standby, prefix, _request())  # another survivor saw the same loss
    taken, seen = take(standby, prefix, 0, 2)
    assert taken == _request() and seen == 1
    assert take(standby, prefix, 0, 2) == (None, 1)  # claimed already: not twice


def test_a_request_for_another_count_of_ranks_is_left_to_a_standby_it_fits(store):
    survivor, standby, prefix = store
    assert ask(survivor, prefix, _request(world=6))  # 3 ranks a node
    assert take(standby, prefix, 0, 2) == (None, 1)
    assert take(standby, prefix, 0, 3)[0] == _request(world=6)


@pytest.mark.parametrize("value", [
    "-." + _request().encode(),  # unsealed, as a process without the secret writes it
    "0" * 64 + "." + _request().encode(),  # a wrong seal
    "garbage",
])
def test_what_a_process_without_the_secret_writes_is_never_taken(store, value):
    survivor, standby, prefix = store
    survivor.add(prefix + "takeovers", 1)
    survivor.set(prefix + "takeover.0", value)
    assert take(standby, prefix, 0, 2) == (None, 1)
    assert not survivor.check([prefix + "takeover.0.claimed"])  # not claimed either


def test_a_counted_request_not_written_yet_is_looked_at_again(store):
    survivor, standby, prefix = store
    survivor.add(prefix + "takeovers", 1)  # counted; its value comes later
    assert take(standby, prefix, 0, 2) == (None, 0)
    survivor.set(prefix + "takeover.0", "garbage")
    assert take(standby, prefix, 0, 2) == (None, 1)


@pytest.mark.parametrize("text", ["", "{}", "[1,2]", '{"number": "x"}', "not json"])
def test_a_request_that_is_not_one_is_refused_with_value_error(text):
    with pytest.raises(ValueError, match="not a takeover request"):
        Takeover.decode(text)
