"""State from a peer: real rank processes on a real gloo group agree on the step to resume at,
and the rank without state receives the model, optimizer and RNG state of the one with it; a
source that freezes during the exchange costs the others a bounded, explained error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankguard import margins

from .ranks import Ranks


@pytest.mark.slow  # over 4 s here: out of the quick run
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


SECRET = {"RANKGUARD_SECRET": "4f" * 16}


@pytest.mark.slow  # 4 ranks training twice (18 s): the quick set keeps the state transfer
@pytest.mark.deadline(180)
def test_a_replacement_joins_the_survivors_and_the_run_ends_bit_for_bit_as_a_fault_free_one(
        tmp_path: Path) -> None:
    with Ranks("step_loop", 3, tmp_path / "clean", env=SECRET) as ranks:
        clean = [ranks.result(rank, timeout=90) for rank in range(3)]
    with Ranks("step_loop_exit", 3, tmp_path / "fault", env=SECRET) as ranks:
        assert ranks.wait(2, timeout=90) == 3
        ranks.replace(2)
        faulty = [ranks.result(rank, timeout=90) for rank in range(3)]
    assert [r["step"] for r in clean + faulty] == [12] * 6
    assert all(r["params"] == clean[0]["params"] for r in clean + faulty)
    assert [r["replacement"] for r in faulty] == [False, False, True]
    recoveries = [survivor["recoveries"] for survivor in faulty[:2]]
    assert all(len(r) == 1 for r in recoveries), recoveries
    for (recovery,) in recoveries:
        assert recovery["replaced"] == [2] and recovery["step"] == 5, recovery
        assert recovery["source"] in (0, 1) and recovery["error"] == "", recovery
    source = recoveries[0][0]["source"]
    assert recoveries[source][0]["nbytes"] > 0  # the source sent the state


@pytest.mark.slow
@pytest.mark.deadline(240)
def test_two_faults_in_a_row_are_each_replaced_and_the_run_still_ends_bit_for_bit(
        tmp_path: Path) -> None:
    with Ranks("step_loop", 3, tmp_path / "clean", env=SECRET) as ranks:
        clean = ranks.result(0, timeout=90)
    with Ranks("step_loop_twice", 3, tmp_path / "fault", env=SECRET) as ranks:
        for rank in (1, 2):
            assert ranks.wait(rank, timeout=90) == 3
            ranks.replace(rank)
        faulty = [ranks.result(rank, timeout=90) for rank in range(3)]
    assert all(r["params"] == clean["params"] for r in faulty)
    recoveries = faulty[0]["recoveries"]
    assert [(r["replaced"], r["step"]) for r in recoveries] == [([1], 3), ([2], 8)], \
        json.dumps(recoveries, indent=1)
    assert len(faulty[2]["recoveries"]) == 0  # its replacement joined at the second


@pytest.mark.slow
def test_a_step_loop_with_no_launcher_ends_after_one_regroup_when_a_peer_never_joins(
        tmp_path: Path) -> None:
    # no launcher replaces rank 1: each of the 8 recoveries waited for it again (48 s here)
    env = {"RANKGUARD_COLLECTIVE_TIMEOUT": "3", "SCENARIO_REGROUP_TIMEOUT": "3"}
    with Ranks("step_loop_peer_hangs", 2, tmp_path, launcher="torchrun", env=env) as ranks:
        result = ranks.result(0, timeout=40)
    assert (result["type"], result["missing"]) == ("CollectiveTimeout", [1]), result
    assert "regroup" in result["message"] and result["recoveries"] == 1, result
    # the step's collective (3 s), one regroup (3 s, plus 0.5 s of reads), this machine's load
    assert result["elapsed"] < 3.0 + 3.5 + 4.0, result


@pytest.mark.slow  # four ranks, two replacements started cold (about 30 s)
@pytest.mark.deadline(200)
def test_survivors_and_a_replacement_form_the_next_generation_after_a_member_dies_before_connecting(
        tmp_path: Path) -> None:
    """Rank 1 died; its replacement and survivors 0 and 2 form generation 1 with rank 3, which
    dies before it connects. The survivors' regroup fails within the connect's cap; the next
    one forms with both survivors (each took the other for dead: a rank without a default
    group answered probes with nothing, and each formed a generation alone) and both
    replacements (the first joins it after its own connect failed: it exited on that)."""
    with Ranks("members_die_around_a_replacement", 4, tmp_path, env=SECRET) as ranks:
        assert ranks.wait(1, timeout=60) == 3
        ranks.replace(1)
        assert ranks.wait(3, timeout=90) == 0
        ranks.replace(3)
        results = {rank: ranks.result(rank, timeout=120) for rank in range(4)}
    for survivor in (results[0], results[2]):
        assert survivor["first"]["type"] == "PeerFailed", results
        assert "did not connect" in survivor["first"]["message"], results
        assert not survivor["first"]["initialized"], results
        # the replacement's join (a cold start), the connect's cap, this machine's load
        assert survivor["first"]["elapsed"] < 20 + margins.CONNECT_CAP_S + 10, results
        assert survivor["type"] is None, results
        assert (survivor["number"], survivor["replaced"], survivor["sum"]) == \
            (2, [1, 3], 4.0), results
    for replacement in (results[1], results[3]):
        assert (replacement["type"], replacement["number"]) == (None, 2), results


@pytest.mark.slow  # about 20 s (the 5 s connect floor, a replacement's cold start)
@pytest.mark.deadline(150)
def test_regroup_forms_the_next_generation_after_one_whose_member_died_before_connecting(
        tmp_path: Path) -> None:
    """The failed connect left rank 0 without a default group; its next regroup, keeping the
    size, forms the generation after it with rank 1's replacement (a StepLoop retries so: it
    got a UsageError, 'there is no process group to regroup', and the run ended on it, blaming
    the survivor as for a mistake of its script; and the group torch named then was not the
    one the replacement's first group is named, so the two never connected)."""
    with Ranks("regroup_again_after_a_peer_died_before_connecting", 2, tmp_path,
               env=SECRET) as ranks:
        assert ranks.wait(1, timeout=60) == 0
        ranks.replace(1)
        survivor, replacement = ranks.result(0, timeout=90), ranks.result(1, timeout=90)
    assert survivor["first"]["type"] == "PeerFailed", survivor
    assert not survivor["first"]["initialized"], survivor
    assert survivor["type"] is None, survivor
    assert (survivor["number"], survivor["replaced"], survivor["sum"]) == (2, [1], 2.0), survivor
    assert replacement["type"] is None, replacement
