"""State from a peer: real rank processes on a real gloo group agree on the step to resume at,
and the rank without state receives the model, optimizer and RNG state of the one with it; a
source that freezes during the exchange costs the others a bounded, explained error."""

from __future__ import annotations

from pathlib import Path

import pytest

from .ranks import Ranks


@pytest.mark.deadline(120)
def test_a_rank_without_state_receives_the_peers_state_and_every_rank_agrees_on_the_step(
        tmp_path: Path) -> None:
    with Ranks("share_state", 3, tmp_path) as ranks:
        results = [ranks.result(rank, timeout=60) for rank in range(3)]
    assert [r["step"] for r in results] == [7, 7, 7], results
    assert {r["source"] for r in results} == {0} and results[0]["receivers"] == [2]
    # bit for bit: parameters, the optimizer's momentum and the RNG stream
    assert results[2]["params"] == results[0]["params"] == results[1]["params"]
    assert results[2]["momentum"] == results[0]["momentum"]
    assert results[2]["rng"] == results[0]["rng"]
    assert results[1]["nbytes"] == 0  # a rank that holds the state receives nothing
    assert results[0]["nbytes"] == results[2]["nbytes"] > 0


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_a_source_frozen_during_the_exchange_is_a_bounded_error_naming_it(
        tmp_path: Path) -> None:
    with Ranks("share_state_source_frozen", 3, tmp_path) as ranks:
        results = [ranks.result(rank, timeout=60) for rank in (0, 2)]
    for result in results:
        assert result["type"] in ("CollectiveTimeout", "PeerFailed"), result
        assert result["missing"] == [1], result
        assert result["elapsed"] < 3.0 + 10, result  # the exchange's timeout, plus margin
