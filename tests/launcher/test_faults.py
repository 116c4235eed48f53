"""Each kind of rank fault, at the moments that matter, ends bounded and explained.

Bounds here come from the timeouts each run is given (``budgets``): they prove boundedness, not
speed (bench/ measures speed). Which rank is blamed or a victim, for every combination, is
table-tested in test_monitor_rules.py and test_outcome_rules.py; these runs prove it on real
ranks, signals, /proc and ledgers.
"""

import os

import pytest

from rankguard.launcher.config import DEFAULT_GRACE
from tests.conftest import script
from tests.launcher.budgets import hang_waited_s, stopped_within_s

ALLREDUCE = [script("allreduce.py"), "400", "0.01"]
HANG_S = 2.0  # --hang-timeout of the hang cases


@pytest.mark.parametrize("spec, outcome, detail", [
    pytest.param("crash:3:rank=1,at=op5", "exited", "rank 1 exited with code 3",
                 marks=pytest.mark.slow),  # out of the quick run (its 5 minutes)
    ("kill:rank=1,at=op5", "signalled", "rank 1 was killed by SIGKILL"),
    pytest.param("term:rank=1,at=op5", "signalled",
                 "rank 1 got SIGTERM (tore itself down, exited with code 0)",
                 marks=pytest.mark.slow),
    ("raise:rank=1,at=op5", "raised", "rank 1 raised an exception"),
    pytest.param("kill:rank=0,at=init", "signalled", "rank 0 was killed by SIGKILL",
                 marks=pytest.mark.slow),
    # from a timer thread between collectives: the same verdicts, told apart at op5 already
    pytest.param("crash:rank=1,at=2.5s", "exited", "rank 1 exited with code 1",
                 marks=pytest.mark.slow),
    pytest.param("raise:rank=0,at=3s", "raised", "rank 0 raised an exception",
                 marks=pytest.mark.slow),
])
def test_dying_rank_is_the_root_cause_and_the_others_are_victims(run_rankguard, spec, outcome,
                                                                 detail):
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "3", "--inject", spec,
                         *ALLREDUCE])
    assert run.code == 1, run.stderr
    faulty = int(spec.split("rank=")[1].split(",")[0])
    other = 1 - faulty
    assert run.outcomes() == {faulty: outcome, other: "victim"}
    assert run.event("run_end")["root_cause"] == detail
    assert f"root cause: {detail}" in run.stderr
    escalations = [e for e in run.events if e["event"] == "escalate"]
    assert all(e["step"] == "term" for e in escalations)  # nobody needed SIGKILL


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_survivors_of_a_death_end_on_sigterm_within_the_stacks_step_and_grace(run_rankguard):
    grace = DEFAULT_GRACE  # a victim's teardown may take over 1 s on a loaded 2-core machine
    run = run_rankguard(["--nproc-per-node", "3", "--inject", "kill:rank=2,at=op10",
                         *ALLREDUCE])
    assert run.code == 1
    exits = [e for e in run.events if e["event"] == "rank_exit"]
    assert {e["rank"]: e["outcome"] for e in exits} == {0: "victim", 1: "victim", 2: "signalled"}, \
        run.stderr
    assert [e["step"] for e in run.events if e["event"] == "escalate"] == ["term"]
    assert "all ranks stopped" in run.stderr
    stop_s = float(run.stderr.split("all ranks stopped ")[1].split(" s")[0])
    assert stop_s < stopped_within_s(grace), run.stderr


@pytest.mark.parametrize("spec, reason", [
    ("hang:rank=1,at=op10", "no_progress"),
    pytest.param("stop:rank=0,at=op10", "stopped", marks=pytest.mark.slow),
    # a rank frozen in init: the same ledger wait as at op10 (HangMonitor's table tests)
    pytest.param("hang:rank=1,at=init", "no_progress", marks=pytest.mark.slow),
    pytest.param("stop:rank=1,at=init", "stopped", marks=pytest.mark.slow),
    pytest.param("hang:rank=0,at=8s", "no_progress",  # between collectives, from a timer thread
                 marks=pytest.mark.slow),
])
def test_frozen_rank_is_blamed_within_the_hang_budget_with_stacks(run_rankguard, spec, reason):
    # 1500 steps of >= 10 ms: the loop still runs at 8 s, even when start-up is slow
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", str(HANG_S), "--inject",
                         spec, script("allreduce.py"), "1500", "0.01"])
    assert run.code == 3, run.stderr
    blamed = int(spec.split("rank=")[1].split(",")[0])
    hang = run.event("hang_detected")
    assert hang["blamed"] == [blamed] and hang["waiting"] == [1 - blamed]
    assert hang["reason"] == reason
    if "init" in spec:
        assert hang["op"] == "init_process_group"
    elif "op10" in spec:
        assert (hang["op"], hang["seq"]) == ("all_reduce", 10)
    else:
        assert hang["op"] == "all_reduce" and hang["seq"] > 1
    assert HANG_S <= hang["waited_s"] < hang_waited_s(HANG_S)
    assert run.outcomes() == {blamed: "hung", 1 - blamed: "victim"}
    stacks = (run.log_dir / "attempt0" / f"stacks_rank{blamed}.txt").read_text()
    assert "Current thread" in stacks or "Thread 0x" in stacks
    assert "perform" in stacks  # the injected fault's frame: where the rank was stuck
    assert str(blamed) in hang["stacks"] or blamed in hang["stacks"]


@pytest.mark.slow
def test_busy_rank_is_a_straggler_and_is_not_killed(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "1.5", "--straggler-timeout",
                         "60", "--inject", "slow:5:rank=1,at=op10", script("allreduce.py"), "20"])
    assert run.code == 0, run.stderr
    straggler = run.event("straggler")
    assert straggler["ranks"] == [1] and straggler["seq"] == 10
    assert not [e for e in run.events if e["event"] == "hang_detected"]
    assert run.outcomes() == {0: "ok", 1: "ok"}


@pytest.mark.slow
def test_rank_holding_the_gil_is_blamed_only_after_the_straggler_timeout(run_rankguard):
    straggler_s = 5.0
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "1.5", "--straggler-timeout",
                         str(straggler_s), "--inject", "gil:rank=1,at=op10", *ALLREDUCE])
    assert run.code == 3, run.stderr
    assert run.event("straggler")["ranks"] == [1]
    hang = run.event("hang_detected")
    assert hang["blamed"] == [1] and hang["reason"] == "straggler_timeout"
    assert straggler_s <= hang["waited_s"] < hang_waited_s(straggler_s)
    assert run.event("straggler")["ts"] < hang["ts"]
    # its watcher thread cannot take the GIL: faulthandler answered the second request
    assert "_busy_holding_gil" in (run.log_dir / "attempt0" / "stacks_rank1.txt").read_text()


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_rank_ignoring_sigterm_is_killed_after_grace_with_its_grandchild(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", "--grace", "1", script("ignore_term.py")],
                        timeout=60)
    assert run.code == 1
    assert run.outcomes() == {0: "teardown_timeout", 1: "exited"}
    steps = [e["step"] for e in run.events if e["event"] == "escalate"]
    assert steps == ["term", "kill"]
    # the grandchildren (sleep 600) are gone too: the autouse fixture fails the test otherwise


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_collective_timeout_blames_the_rank_that_never_arrived_not_the_one_that_raised(
        run_rankguard):
    collective_s, hang_s = 1.0, 60.0
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", str(hang_s),
                         "--collective-timeout", str(collective_s), "--inject",
                         "stop:rank=1,at=op5", *ALLREDUCE])
    assert run.code == 3, run.stderr
    assert run.outcomes() == {0: "victim", 1: "hung"}
    hang = run.event("hang_detected")
    assert hang["blamed"] == [1] and hang["reason"] == "collective_deadline"
    assert (hang["op"], hang["seq"]) == ("all_reduce", 5)
    assert "rankguard.errors.CollectiveTimeout: rank 0: all_reduce #5" in run.stderr
    # the collective's deadline decided, not the hang timeout
    assert collective_s <= hang["waited_s"] < hang_s


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_bounded_ranks_get_the_launchers_notice_and_raise_peer_failed_before_any_sigterm(
        run_rankguard):
    # The notice gives the survivors --grace to end on their own: a generous grace makes "no
    # SIGTERM for them" hold however loaded the machine, and costs nothing once they have ended.
    run = run_rankguard(["--nproc-per-node", "3", "--hang-timeout", "2", "--grace", "30",
                         "--collective-timeout", "120", "--inject", "stop:rank=1,at=op5",
                         *ALLREDUCE], timeout=100)
    assert run.code == 3, run.stderr
    assert run.outcomes() == {0: "victim", 1: "hung", 2: "victim"}
    steps = [(e["step"], e["ranks"]) for e in run.events if e["event"] == "escalate"]
    assert steps[0] == ("notice", [0, 2])
    assert ("term", [1]) in steps  # only the hung rank needed a signal
    assert "PeerFailed: rank 0: all_reduce #5" in run.stderr
    assert "the supervisor reported that rank 1 hung" in run.stderr


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_a_rank_that_finished_before_a_peer_failed_is_ok_though_it_exits_after_the_teardown(
        run_rankguard, tmp_path):
    fifo = tmp_path / "done.fifo"
    os.mkfifo(fifo)
    run = run_rankguard(["--nproc-per-node", "2", script("done_then_peer_fails.py"), str(fifo)])
    assert run.code == 1, run.stderr[-3000:]
    assert run.event("run_end")["root_cause"] == "rank 1 exited with code 3"
    assert run.outcomes() == {0: "ok", 1: "exited"}  # rank 0 was labelled victim
    assert "[rank1]:rank 0 said 'done'" in run.stdout


@pytest.mark.slow  # about 10 s
def test_a_rank_slow_in_its_own_tail_of_init_while_its_peers_went_on_is_no_hang(run_rankguard):
    """Rank 0's store connection for the probes (after the group formed) takes 4 s, over
    --hang-timeout; rank 1 went on, computing. Nobody waits for rank 0, so nobody hangs: before,
    init read as a collective rank 0 never completed, and every rank was blamed."""
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "2",
                         "--collective-timeout", "30", script("slow_probe_start.py"), "4"],
                        timeout=90)
    assert run.code == 0, run.stderr[-3000:]
    assert all(f"OK rank={r}" in run.stdout for r in (0, 1)), run.stdout
    assert not [e for e in run.events if e["event"] == "hang_detected"], run.stderr[-3000:]
