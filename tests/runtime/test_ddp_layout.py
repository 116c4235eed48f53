"""``runtime.ddp_layout`` against DDP itself, on two real gloo ranks: the layout predicted from
the first backward's order is the one DDP lays its buckets out as at its second forward, and a
DDP built with it has those buckets, also for a model with a frozen parameter (whose indices
count only the parameters DDP puts in buckets)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime.ranks import Ranks


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_the_predicted_layout_is_the_one_ddp_lays_out_and_builds(tmp_path: Path) -> None:
    with Ranks("ddp_layouts", 2, tmp_path) as ranks:
        results = [ranks.result(rank, timeout=60) for rank in (0, 1)]
        assert [ranks.wait(rank, 30) for rank in (0, 1)] == [0, 0], ranks.output()
    assert results[0] == results[1]
    for cap, found in results[0].items():
        assert found["predicted"] == found["rebuilt"] == found["built"], (cap, found)
        # a layout of its own (else the check could not fail): not DDP's first one
        assert found["predicted"] != found["initial"], (cap, found)
        assert sorted(i for bucket in found["predicted"] for i in bucket) == list(range(5))
    assert len(results[0]["0.1"]["predicted"]) > 1  # several buckets
