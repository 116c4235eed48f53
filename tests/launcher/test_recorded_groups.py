"""Groups rankguard does not wrap (NCCL's) are judged by what torch's Flight Recorder counts:
enqueued and completed, published in the ledger by the rank's sampler thread. On CPU the same
path runs on gloo groups under ``RANKGUARD_GLOO=recorder``: real ranks, real gloo, the real
recorder, the launcher's real verdicts. (The GPU set runs it on NCCL: tests/gpu.)"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from rankguard.records import recent_file
from tests.conftest import ROOT, script

RECORDER = {"RANKGUARD_GLOO": "recorder"}
HANG = 2.0


def job(*args: str, nproc: int = 2, flags: tuple[str, ...] = ("--hang-timeout", str(HANG))
        ) -> list[str]:
    return ["--nproc-per-node", str(nproc), *flags, script("async_job.py"), "gloo", *args]


BOUNDED = ("--collective-timeout", "2", "--hang-timeout", "30")  # the deadline comes first


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_a_clean_job_of_recorded_groups_ends_well_and_steps(run_rankguard):
    # 10 s, not HANG: a rank its load holds up 2 s is a straggler, rightly reported (slow set
    # beside two busy processes: rank 0)
    run = run_rankguard(job("clean", nproc=3, flags=("--hang-timeout", "10")), env=RECORDER)
    assert run.code == 0, run.stderr
    assert all(f"OK rank={r} backend=gloo" in run.stdout for r in range(3)), run.stdout
    # a straggler report (a busy rank absent past --hang-timeout 2 s: 4 ranks on a loaded
    # 2-core machine) is a warning the job survives; a hang verdict would kill it
    assert not [e for e in run.events if e["event"] == "hang_detected"]


@pytest.mark.parametrize("scenario, at, verdict", [
    ("sleep", "7", "rank 1 never enqueued all_reduce #7 (made no progress); rank 0 waited"),
    pytest.param("subgroup", "4", "rank 1 never enqueued all_reduce #4 on group ranks 0,1 (made "
                 "no progress); rank 0 waited", marks=pytest.mark.slow),  # 3 ranks, 7 s
])
def test_a_rank_that_never_enqueues_the_operation_is_blamed_by_name(run_rankguard, scenario,
                                                                    at, verdict):
    run = run_rankguard(job(scenario, at, nproc=3 if scenario == "subgroup" else 2),
                        env=RECORDER)
    assert run.code == 3, run.stderr
    hang = run.event("hang_detected")
    assert hang["blamed"] == [1]
    assert f"rankguard: hang: {verdict}" in run.stderr, run.stderr
    # the rank that issued operations ahead (asynchronously) waits in the first not completed
    assert HANG <= hang["waited_s"] < HANG + 3, hang


@pytest.mark.slow  # 5 s
def test_a_rank_that_stops_between_steps_of_operations_in_flight_at_once_is_blamed_alone(
        run_rankguard):
    """gloo runs a step's operations on two threads at once, and torch's completed count is
    the one that finished last: the group's progress is what the recorder's entries show."""
    run = run_rankguard(job("steps", "5"), env=RECORDER)
    assert run.code == 3, run.stderr
    first = re.search(r"STEP rank=0 step=5 first=(\d+)", run.stdout)
    assert first, run.stdout
    hang = run.event("hang_detected")
    assert hang["blamed"] == [1], hang
    assert (f"rankguard: hang: rank 1 never enqueued all_reduce #{first[1]} (made no "
            "progress); rank 0 waited") in run.stderr, run.stderr


@pytest.mark.slow  # 9 s; stragglers stay quick in test_stragglers
def test_a_busy_rank_is_a_straggler_and_the_job_ends_well(run_rankguard):
    run = run_rankguard(job("busy", "4", str(3 * HANG)), env=RECORDER)
    assert run.code == 0, run.stderr
    assert run.event("straggler")["ranks"] == [1]
    run.event("first_step")  # the world's first collective, as torch numbers them
    assert "rankguard: straggler: rank 1 never enqueued all_reduce #4 (busy" in run.stderr


@pytest.mark.parametrize("size, problem", [
    ("0", "TORCH_FR_BUFFER_SIZE=0: turns off torch's Flight Recorder, through which "
          "RANKGUARD_GLOO=recorder watches gloo groups"),
    ("abc", "TORCH_FR_BUFFER_SIZE='abc': is not a number of entries (torch aborts every rank "
            "on it)"),
])
def test_a_recorder_size_that_would_leave_nothing_watched_is_refused_before_any_rank(
        run_rankguard, size, problem):
    run = run_rankguard(job("clean"), env={**RECORDER, "TORCH_FR_BUFFER_SIZE": size})
    assert run.code == 2, run.stderr
    assert problem in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert "[rank" not in run.stderr  # no rank started


def test_a_bad_gloo_mode_is_refused_before_the_script_runs(run_rankguard):
    run = run_rankguard(job("clean"), env={"RANKGUARD_GLOO": "record"})
    assert run.code == 2, run.stderr
    assert "RANKGUARD_GLOO='record'" in run.stderr and "wrap or recorder" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_a_collective_past_its_deadline_raises_naming_the_rank_that_never_enqueued_it(
        run_rankguard):
    run = run_rankguard(job("bounded", "5", flags=BOUNDED), env=RECORDER)
    assert run.code == 3, run.stderr  # a hang: the rank it names is blamed
    assert ("CollectiveTimeout: rank 0: all_reduce #5 on group 'world' passed its deadline of "
            "2 s after 2." in run.stderr), run.stderr
    assert "ranks that had not arrived: 1 (rank 1 had enqueued collectives up to #4)" \
        in run.stderr, run.stderr
    hang = run.event("hang_detected")
    assert (hang["blamed"], hang["reason"]) == ([1], "collective_deadline"), hang


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_the_survivors_of_a_collective_deadline_regroup_and_all_reduce(run_rankguard):
    run = run_rankguard(job("bounded_regroup", "5", "30", nproc=3, flags=BOUNDED),
                        env=RECORDER)
    assert run.code == 0, run.stderr
    for rank in (0, 2):
        assert f"CAUGHT rank={rank} missing=[1]" in run.stdout, run.stdout
    assert "REGROUPED rank=0 size=2 sum=2" in run.stdout, run.stdout
    assert "REGROUPED rank=1 size=2 sum=2" in run.stdout, run.stdout


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_a_deadline_block_bounds_the_wait_for_a_recorded_groups_collective(run_rankguard):
    run = run_rankguard(job("deadline_block", "5", "2", flags=("--hang-timeout", "30")),
                        env=RECORDER)
    assert run.code == 1, run.stderr
    # no job-wide deadline: no probe, so no rank named; the launcher blames the rank that raised
    assert ("CollectiveTimeout: rank 0: all_reduce #5 on group 'world' passed its deadline of "
            "2 s after " in run.stderr), run.stderr
    assert run.event("run_end")["root_cause"].startswith("rank 0 raised"), run.stderr


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_in_bounded_mode_the_supervisors_notice_ends_a_waiting_rank_on_its_own(run_rankguard):
    run = run_rankguard(job("bounded", "5", flags=("--collective-timeout", "60",
                                                   "--hang-timeout", "2", "--grace", "20")),
                        env=RECORDER)
    assert run.code == 3, run.stderr
    assert run.event("hang_detected")["blamed"] == [1]
    assert ("PeerFailed: rank 0: all_reduce #5 on group 'world' was abandoned: the supervisor "
            "reported that rank 1 hung" in run.stderr), run.stderr
    # told by the notice, rank 0 ended on its own: no SIGTERM, far within --grace
    assert not [e for e in run.events if e["event"] == "escalate" and e["step"] == "term"
                and 0 in e["ranks"]], run.events
    assert run.wall_s < 20, run.wall_s


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_every_rank_keeps_torchs_flight_recorder_dump_for_torchs_analyser(run_rankguard):
    run = run_rankguard(job("sleep", "7"), env=RECORDER)
    assert run.code == 3, run.stderr
    folder = run.log_dir / "attempt0"
    assert sorted(p.name for p in folder.glob("torch_fr_rank_*")) == \
        ["torch_fr_rank_0", "torch_fr_rank_1"], run.stderr
    assert "torch's Flight Recorder dump kept" in run.stderr, run.stderr
    analysed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder),
         "--prefix", "torch_fr_rank_"], capture_output=True, text=True, timeout=60)
    found = analysed.stdout + analysed.stderr
    assert analysed.returncode == 0, found[-3000:]
    assert "Not all ranks joining collective, sequence number: 7" in found, found[-3000:]
    assert "missing ranks: {1}" in found, found[-3000:]


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.parametrize("kind, reason", [("hang", "made no progress"),
                                          ("stop", "stopped (SIGSTOP)")])
def test_a_fault_injected_at_an_operation_fires_on_a_group_rankguard_does_not_wrap(
        run_rankguard, kind, reason):
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", str(HANG), "--inject",
                         f"{kind}:rank=1,at=op5", script("allreduce.py"), "400", "0.01"],
                        env=RECORDER)
    assert run.code == 3, run.stderr
    assert f"[rank1]:rankguard: injecting {kind}:rank=1,at=op5" in run.stderr, run.stderr
    assert f"rankguard: hang: rank 1 never enqueued all_reduce #5 ({reason})" in run.stderr, \
        run.stderr


@pytest.mark.slow  # 5 s
def test_after_a_hang_the_report_lists_each_ranks_last_operations_of_the_stuck_group(
        run_rankguard):
    """The sampler keeps the recent-operations ring of a group it watches through the recorder
    (issue 29): rank 0 enqueued #7 to #16 and waits in #7, rank 1 never enqueued #7."""
    run = run_rankguard(job("sleep", "7"), env=RECORDER)
    assert run.code == 3, run.stderr
    made = subprocess.run([sys.executable, "-m", "rankguard.cli", "report", str(run.log_dir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    kept = recent_file.read_attempt(str(run.log_dir / "attempt0"))
    assert sorted(kept) == [0, 1], run.stderr
    waiter, culprit = kept[0].ops, kept[1].ops
    assert [op.label for op in waiter] == [f"all_reduce #{n}" for n in range(1, 17)], waiter
    assert [op.label for op in culprit] == [f"all_reduce #{n}" for n in range(1, 7)], culprit
    assert all(op.t_done is not None and op.t_done >= op.t_enter for op in waiter[:6] + culprit)
    pending = waiter[6]  # the one rank 0 waits in, and those it enqueued after it
    assert all(op.t_done is None and op.state == "enqueued" for op in waiter[6:]), waiter
    assert all(op.bytes == 4096 for op in waiter + culprit), waiter  # 1024 float32 each
    page = (run.log_dir / "report.html").read_text()
    assert f"{pending.label} (4096 bytes): enqueued at +" in page and "never seen completed" in page
