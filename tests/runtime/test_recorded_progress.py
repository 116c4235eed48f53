"""What the ledger records stays true to what the rank does, end to end: a collective that gloo
refuses at once is not left in progress (a healthy job that goes quiet afterwards is not called
hung), and a monitored_barrier is recorded like any barrier (a hang in it is seen)."""

import pytest

from tests.conftest import script


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_a_collective_refused_at_once_is_not_left_in_progress(run_rankguard):
    # quiet for 1.5 s after the refused calls, with --hang-timeout 1: recorded in progress, the
    # refused ones would make both ranks look stuck in their last all_reduce
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "1",
                         script("refused_then_healthy.py"), "1.5"], timeout=90)
    assert run.code == 0, run.stderr[-3000:]
    assert "rank 0 OK" in run.stdout and "rank 1 OK" in run.stdout


@pytest.mark.slow
def test_a_hang_in_a_monitored_barrier_is_seen(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "2",
                         script("monitored_barrier_hang.py")], timeout=90)
    assert run.code == 3, run.stderr[-3000:]
    root = run.event("run_end")["root_cause"]
    assert root.startswith("hang: rank 1 never reached barrier #11 (made no progress)"), root


@pytest.mark.slow
def test_groups_beyond_the_ledgers_slots_are_said_to_be_unwatched(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", script("many_groups.py")], timeout=90)
    assert run.code == 0, run.stderr[-3000:]
    said = [line for line in run.stdout.splitlines() + run.stderr.splitlines()
            if "are not watched" in line]
    assert len(said) == 2, said  # once per rank
    assert "process group '64'" in said[0] and "collective deadlines still apply" in said[0]


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_sigterm_while_the_main_thread_holds_the_completions_queue_tears_down_at_once(
        run_rankguard):
    # the signal handler waits in the main thread for the teardown, which must not wait for
    # the queue the main thread holds (it did: exit 143 once the grace had passed)
    run = run_rankguard(["--nproc-per-node", "1", "--grace", "5",
                         script("sigterm_holding_tracker.py")], timeout=90)
    said = run.stdout + run.stderr
    assert "SIGTERM: torn down in" in said and "exiting 0" in said, said[-3000:]
    assert "overran" not in said
    assert run.wall_s < 30, run.wall_s
