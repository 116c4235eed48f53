"""The verdicts on real ranks: a rank that left first is the root cause with its exit code, a
mismatch is named with its operations and group, and a stopped rank says why it was stopped.

(The decision rules themselves are table-tested in test_monitor_rules.py and
test_outcome_rules.py.)"""

import pytest

from tests.conftest import script


@pytest.mark.parametrize("how, code, detail", [
    # sys.exit(3) takes the ledger path of sys.exit(0) below; a non-zero code's verdict is
    # table-tested (test_outcome_rules.py)
    pytest.param("exit3", 3, "rank 1 exited with code 3", marks=pytest.mark.slow),
    ("exit0", 0, "rank 1 exited with code 0 before all_reduce #11 (rank 0 went on to it)"),
    *(pytest.param(how, 0, "rank 1 exited with code 0 before all_reduce #11 (rank 0 went on to "
                   "it)", marks=pytest.mark.slow) for how in ("os_exit0", "return")),
])
def test_rank_that_leaves_before_its_peers_collective_is_the_root_cause(run_rankguard, how,
                                                                       code, detail):
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "3",
                         script("leave_early.py"), how])
    assert run.code == 1, run.stderr
    assert run.outcomes() == {0: "victim", 1: "exited"}
    assert run.event("run_end")["root_cause"] == detail
    assert f"root cause: {detail}" in run.stderr
    [exit1] = [e for e in run.events if e["event"] == "rank_exit" and e["rank"] == 1]
    assert exit1["exit_code"] == code


@pytest.mark.parametrize("group, label", [
    # the sub-group case proves the same on a sub-group's ledger slot (labels: table-tested)
    pytest.param("world", "world", marks=pytest.mark.slow),
    pytest.param("sub", "ranks 0,1", marks=pytest.mark.slow)])
def test_mismatched_operations_are_named_with_each_ranks_operation_and_the_group(
        run_rankguard, group, label):
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "2", script("mismatch.py"),
                         group])
    assert run.code == 3, run.stderr
    hang = run.event("hang_detected")
    seq = 31  # after 30 all-reduces, on either group
    assert (hang["reason"], hang["group"], hang["seq"]) == ("mismatch", label, seq)
    assert hang["ops"] == {"0": "recv", "1": "barrier"}
    assert hang["blamed"] == [0, 1]
    assert (f"mismatched operations #{seq} on group {label}: rank 0 in recv, rank 1 in "
            "barrier") in run.stderr
    assert run.outcomes() == {0: "hung", 1: "hung"}


@pytest.mark.slow  # moved out of the README's 5-minute run; test_faults' verdicts stay
def test_each_stopped_rank_says_why_the_launcher_stopped_it(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "2", "--inject",
                         "hang:rank=1,at=op5", script("allreduce.py"), "400", "0.01"])
    assert run.code == 3, run.stderr
    logs = {r: (run.log_dir / "attempt0" / f"rank{r}.log").read_text() for r in (0, 1)}
    assert ("rankguard: rank 1: stopped by the launcher, which blamed this rank for a hang "
            "(SIGTERM): torn down in ") in logs[1]
    assert ("rankguard: rank 0: stopped by the launcher because rank 1 hung (SIGTERM): torn "
            "down in ") in logs[0]
