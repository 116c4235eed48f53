"""Suites that every rank of a job runs, and suites split over pytest-xdist workers."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .released import released_by
from .suite import run_suite
from .test_plugin_deadlines_and_leaks import CHILD_NEVER_EXITS, SLEEPS

CONFTEST = '''
import pytest
import torch.distributed as dist

@pytest.fixture(scope="session", autouse=True)
def group():
    dist.init_process_group("gloo")
    yield
'''

RANK_SUITE = '''
import os
import signal
import torch
import torch.distributed as dist

def test_allreduce():
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == dist.get_world_size()

def test_rank1_freezes_before_the_end_of_the_session():
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
'''


def every_rank_runs(run_rankguard, tmp_path: Path, tests: str, launcher_args: list[str],
                    pytest_args: list[str], conftest: str = ""):
    """``rankguard run --nproc-per-node 2 -m pytest`` on a suite whose conftest makes the group
    (and has ``conftest`` added)."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(textwrap.dedent(CONFTEST) + textwrap.dedent(conftest))
    (suite / "test_suite.py").write_text(textwrap.dedent(tests))
    return run_rankguard(["--nproc-per-node", "2", *launcher_args, "-m", "pytest", "-q",
                          "-p", "no:cacheprovider", "-p", "no:timeout", "--rootdir", str(suite),
                          *pytest_args, str(suite)],
                         timeout=120)


@pytest.mark.slow
def test_under_a_launcher_the_end_of_session_barrier_is_bounded_and_names_the_missing_rank(
        run_rankguard, tmp_path: Path) -> None:
    run = every_rank_runs(run_rankguard, tmp_path, RANK_SUITE, ["--hang-timeout", "60"],
                          ["-o", "rankguard_shutdown_timeout=3"])
    assert "[rank0]:rankguard: session teardown: ranks 1 did not arrive" in run.stdout + run.stderr
    assert "[rank0]:2 passed" in run.stdout + run.stderr
    assert run.code == 3  # the launcher blames the rank that never arrived, not rank 0
    hang = run.event("hang_detected")
    assert hang["blamed"] == [1] and hang["op"] == "shutdown"
    assert run.outcomes() == {0: "victim", 1: "hung"}
    assert run.wall_s < 60  # the 3 s barrier decided, not the 60 s hang timeout


@pytest.mark.slow  # a whole xdist session in a session (10 s)
def test_with_xdist_each_worker_guards_its_own_tests_and_the_controller_never_hangs(
        tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    session = run_suite(tmp_path, {"test_sleeps.py": SLEEPS, "test_child.py": CHILD_NEVER_EXITS},
                        ["-n", "2", "--rankguard-deadline", "3"], timeout=120)
    assert session.result("test_sleeps_in_call") == "failed"
    assert "deadline of 3 s passed during the call" in session.text("test_sleeps_in_call")
    assert session.result("test_joins_a_child_that_never_exits") == "failed"
    assert session.cases["test_good_after"] and all(
        o.result == "passed" for o in session.cases["test_good_after"])
    assert session.code == 1 and session.wall_s < 60


def test_xdist_inside_a_rank_of_a_suite_every_rank_runs_is_a_usage_error_before_any_worker(
        tmp_path: Path) -> None:
    # one rank of a job is one session whose tests pair with its peers' by their order: -n
    # would split them over workers that each think they are the rank (once: a worker that
    # hung in the collection check, reported as "crashed", with nothing saying why)
    pytest.importorskip("xdist")
    session = run_suite(tmp_path, {"test_one.py": "def test_one():\n    pass\n"}, ["-n", "2"],
                        timeout=60, env={"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"})
    assert session.code == pytest.ExitCode.USAGE_ERROR, session.output[-3000:]
    assert "pytest-xdist (-n 2) cannot split a suite every rank runs" in session.output, \
        session.output[-3000:]
    assert "bringing up nodes" not in session.output


DISAGREES = '''
import time
import torch
import torch.distributed as dist

def test_rank1_disagrees():
    if dist.get_rank() == 1:
        assert dist.get_rank() == 0, "rank 1 disagrees"
    dist.all_reduce(torch.ones(1))

def test_collectives_work_again_after_the_failure():
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2

def test_rank1_fails_after_its_collectives():
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 1:
        time.sleep(0.5)  # rank 0 is waiting in the next test's all_reduce by then
        assert dist.get_rank() == 0, "rank 1 fails late"

def test_rank0_ran_ahead_into_this_one():
    dist.all_reduce(torch.ones(1))

def test_last():
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2
'''


def released_run(run_rankguard, tmp_path: Path, tests: str, conftest: str = "",
                 launcher_args: tuple[str, ...] = ()):
    """``every_rank_runs`` with a 60 s test deadline that no failure should wait for; the run
    and each rank's log."""
    run = every_rank_runs(run_rankguard, tmp_path, tests, list(launcher_args),
                          ["-rA", "--rankguard-deadline", "60",
                           "-o", "rankguard_shutdown_timeout=5"], conftest)
    return run, {rank: (run.log_dir / "attempt0" / f"rank{rank}.log").read_text()
                 for rank in (0, 1)}


def outcome(log: str, test: str) -> str | None:
    """A test's outcome in the short summary (``-rA``) of one rank's log."""
    found = re.search(rf"^(PASSED|FAILED|ERROR) \S*test_suite\.py::{test}\b", log, re.M)
    return found.group(1) if found else None


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_under_a_launcher_a_rank_that_fails_first_releases_its_peers_and_the_group_is_reformed(
        run_rankguard, tmp_path: Path) -> None:
    run, logs = released_run(run_rankguard, tmp_path, DISAGREES)
    assert "AssertionError: rank 1 disagrees" in logs[1]
    # rank 0 is released, however the race went (see tests/testing/released.py)
    assert released_by(logs[0], r"rank 1 failed test_suite\.py::test_rank1_disagrees"), \
        logs[0][-4000:]
    for rank in (0, 1):  # each failure was followed by a fresh generation, on both ranks
        for test in ("test_collectives_work_again_after_the_failure", "test_last"):
            assert outcome(logs[rank], test) == "PASSED", logs[rank][-4000:]
    assert "AssertionError: rank 1 fails late" in logs[1]
    assert outcome(logs[0], "test_rank1_fails_after_its_collectives") == "PASSED"
    assert outcome(logs[0], "test_rank0_ran_ahead_into_this_one") == "FAILED"
    assert "PeerFailed: rank 0: all_reduce #3 on group 'world' was abandoned: rank 1 failed " \
           "test_suite.py::test_rank1_fails_after_its_collectives" in logs[0]  # released at once
    assert "rankguard: the other ranks were past this test when the process group was " \
           "re-formed after rank 1 failed test_suite.py::test_rank1_fails_after_its_collectives;" \
           " all resume at test_suite.py::test_last" in logs[1]
    assert run.wall_s < 40  # released at once, not at the 60 s test deadline


def test_a_session_with_warnings_as_errors_starts_when_rankguard_was_imported_before_pytest(
        tmp_path: Path) -> None:
    # as under the launcher's bootstrap: pytest marks the plugin's package for assertion
    # rewriting, and warned (an error here) that the imported one could not be rewritten
    (tmp_path / "test_x.py").write_text("def test_x():\n    assert True\n")
    done = subprocess.run(
        [sys.executable, "-c", "import rankguard, sys, pytest; sys.exit(pytest.main())",
         "-q", "-p", "no:cacheprovider", "-W", "error", "--rootdir", str(tmp_path),
         str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow  # two ranks under the launcher (3 s idle)
def test_under_rankguard_run_a_session_with_warnings_as_errors_runs(
        run_rankguard, tmp_path: Path) -> None:
    run = every_rank_runs(run_rankguard, tmp_path, RANK_SUITE.split("def test_rank1")[0], [],
                          ["-W", "error"])
    assert run.code == 0, run.stdout + run.stderr
    assert "[rank0]:1 passed" in run.stdout + run.stderr


ONE_COLLECTIVE_MORE = '''
import torch
import torch.distributed as dist

def test_rank0_runs_one_collective_more():
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins it: it goes on, to the session end

def test_last():
    pass
'''


@pytest.mark.slow  # one test deadline (5 s) and two ranks
def test_a_rank_in_session_teardown_is_named_so_and_costs_one_test_deadline_not_two(
        run_rankguard, tmp_path: Path) -> None:
    deadline = 5
    run = every_rank_runs(run_rankguard, tmp_path, ONE_COLLECTIVE_MORE, ["--hang-timeout", "60"],
                          ["-rA", "--durations=0", "--durations-min=0", "--rankguard-deadline",
                           str(deadline), "-o", "rankguard_shutdown_timeout=40"])
    logs = {rank: (run.log_dir / "attempt0" / f"rank{rank}.log").read_text() for rank in (0, 1)}
    assert outcome(logs[1], "test_rank0_runs_one_collective_more") == "PASSED", logs[1][-3000:]
    assert outcome(logs[0], "test_rank0_runs_one_collective_more") == "FAILED", logs[0][-3000:]
    assert "deadline of 5 s passed during the call" in logs[0]
    assert re.search(r"SKIPPED \[1\] \S+: rankguard: rank 1 had finished its tests \(it is in "
                     r"session teardown\)", logs[0]), logs[0][-3000:]
    # the setup of the test after the failure did not wait for rank 1 (it waited a deadline)
    setup = re.search(r"^([\d.]+)s setup +\S*test_suite\.py::test_last$", logs[0], re.M)
    assert setup and float(setup.group(1)) < deadline / 2, logs[0][-3000:]


LEAVES_OUTSIDE_THE_CALL = '''
import pytest
import torch
import torch.distributed as dist

def total(value):
    t = torch.full((1,), value)
    dist.all_reduce(t)
    return t.item()

@pytest.fixture
def fails_on_rank1():
    if dist.get_rank() == 1:
        raise RuntimeError("the fixture fails on rank 1")
    yield

def test_setup_fails_on_rank1(fails_on_rank1):
    assert total(1.0) == 2.0  # paired with rank 1's next all_reduce, it would read 11

def test_after_the_setup():
    assert total(10.0) == 20.0

def test_rank1_skips():
    if dist.get_rank() == 1:
        pytest.skip("rank 1 has no use for it")
    assert total(1.0) == 2.0

@pytest.mark.skip(reason="skipped by its mark on every rank")
def test_marked_to_skip():
    pass

def test_last():
    assert total(100.0) == 200.0
'''


@pytest.mark.slow  # two ranks under the launcher (5 s)
def test_a_rank_that_leaves_a_test_in_a_fixture_or_by_a_skip_releases_its_peers_naming_how(
        run_rankguard, tmp_path: Path) -> None:
    run, logs = released_run(run_rankguard, tmp_path, LEAVES_OUTSIDE_THE_CALL)
    # rank 0 waits in no collective of rank 1's next test, and is told why rank 1 left
    assert released_by(logs[0], r"rank 1 failed the setup of test_suite\.py::test_setup_fails_on_"
                                r"rank1"), logs[0][-4000:]
    assert released_by(logs[0], r"rank 1 skipped test_suite\.py::test_rank1_skips"), \
        logs[0][-4000:]
    for rank in (0, 1):
        for test in ("test_after_the_setup", "test_last"):
            assert outcome(logs[rank], test) == "PASSED", logs[rank][-4000:]
        # a skip by its mark is every rank's: nobody re-forms the group for it
        assert "re-formed after rank 0 skipped the setup" not in logs[rank]
        assert "re-formed after rank 1 skipped the setup" not in logs[rank]
    assert run.wall_s < 40  # released at once, not at the 60 s test deadline

