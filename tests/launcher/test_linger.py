"""A rank whose script returned (code 0) but whose process does not exit (a non-daemon thread
blocked for good, an atexit handler that sleeps) is ended by the launcher once
``margins.linger_limit`` passed, with its stacks and a line saying where it lingered; the run's
result stays its scripts'. Real ranks, real threads, real signals."""

from __future__ import annotations

import pytest

from tests.conftest import script

LIMIT = 2.0  # --straggler-timeout: the linger limit (margins.linger_limit)
GRACE = 2.0


@pytest.mark.parametrize("mode, lingerer, where", [
    ("thread", 1, "hold_forever ("),
    pytest.param("atexit", 0, "sleep_at_exit (", marks=pytest.mark.slow),
])
def test_a_rank_whose_script_returned_but_whose_process_lingers_is_ended_with_its_stacks(
        run_rankguard, mode, lingerer, where):
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "2", "--straggler-timeout",
                         str(LIMIT), "--grace", str(GRACE), script("linger.py"), mode,
                         str(lingerer)], timeout=60)
    assert run.code == 0, run.stderr  # every script returned 0: the run succeeded
    assert all(f"RETURNED rank={r}" in run.stdout for r in (0, 1)), run.stdout
    said = [line for line in run.stderr.splitlines()
            if line.startswith(f"rankguard: rank {lingerer}'s script ended ")]
    assert len(said) == 1 and "but its process did not exit" in said[0], run.stderr
    assert f"{where}" in run.stderr and "linger.py:" in run.stderr, run.stderr
    linger = run.event("linger")
    assert (linger["rank"], linger["killed"]) == (lingerer, False), linger
    # bounded, not punctual: 8 s was seen with four test workers on two cores
    assert LIMIT <= linger["since_s"] < LIMIT + 15, linger
    assert any(where in line for line in linger["threads"]), linger
    exits = {e["rank"]: e for e in run.events if e["event"] == "rank_exit"}
    assert (exits[lingerer]["outcome"], exits[lingerer]["exit_code"]) == ("ok", 0), exits
    assert run.wall_s < LIMIT + GRACE + 20, run.wall_s


@pytest.mark.slow  # two ranks that start torch: over 3 s here
@pytest.mark.parametrize("mode", ["thread", "atexit"])
def test_a_process_that_exits_non_zero_by_itself_after_its_script_returned_fails_the_run(
        run_rankguard, mode):
    # os._exit(7) in a thread or an atexit handler once the script returned: torchrun fails
    # the run (exit 1); the run must not be reported as succeeded
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "2",
                         script("exit_after_return.py"), mode], timeout=60)
    assert run.code == 1, run.stderr
    end = run.event("run_end")
    assert end["root_cause"] == \
        "rank 1 exited with code 7 after its script ended with code 0", end
    exits = {e["rank"]: e for e in run.events if e["event"] == "rank_exit"}
    assert (exits[1]["outcome"], exits[1]["exit_code"]) == ("exited", 7), exits
    assert exits[0]["outcome"] == "ok", exits
