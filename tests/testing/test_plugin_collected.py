"""Suites every rank runs, whose ranks collected different tests: every rank stops before its
first test (before its first test's call where no launcher hosts the store), naming the first
test that differs and which ranks have which, under ``rankguard run``, ``torchrun`` and a plain
environment; none pairs its test's collectives with another test's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rankguard.processes import proctree
from tests.runtime.ranks import free_port

from .test_plugin_session import CONFTEST, outcome, released_run

OTHER_TESTS_ON_RANK1 = '''
import os

def pytest_collection_modifyitems(config, items):  # as a -k given to rank 1 alone
    if os.environ["RANK"] == "1":
        items[:] = [item for item in items if item.name != "test_rank0_only"]
'''

LATE_DESELECTION_ON_RANK1 = '''
import os

def pytest_collection_finish(session):  # a plugin that trims the final list itself, on rank 1
    if os.environ["RANK"] == "1":
        session.items[:] = [item for item in session.items if item.name != "test_rank0_only"]
'''

COLLECT_ONLY_ON_RANK0 = '''
import os

def pytest_configure(config):  # as --collect-only given to rank 0 alone
    if os.environ["RANK"] == "0":
        config.option.collectonly = True
'''

SUITE = '''
import torch
import torch.distributed as dist

def total(value):
    t = torch.full((1,), value)
    dist.all_reduce(t)
    return t.item()

def test_first():
    assert total(1.0) == 2.0

def test_rank0_only():
    assert total(10.0) == 20.0  # paired with rank 1's test_both, it would read 110

def test_both():
    assert total(100.0) == 200.0
'''

DIFFERENCE = ("rankguard: the ranks collected different tests, so their collectives would pair "
              "across tests; every rank stops: rank 1 collected 2 tests, rank 0 3: first "
              "difference at index 1: rank 0 has test_suite.py::test_rank0_only, rank 1 "
              "test_suite.py::test_both; run every rank with the same selection")
TESTS = ("test_first", "test_rank0_only", "test_both")
RUN_S = 90.0


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.parametrize("selection", [OTHER_TESTS_ON_RANK1, LATE_DESELECTION_ON_RANK1],
                         ids=["modifyitems", "collection_finish"])
def test_under_rankguard_run_ranks_that_collected_other_tests_stop_before_any_test_naming_them(
        run_rankguard, tmp_path: Path, selection: str) -> None:
    # the ranks compare the list they will run, whichever hook made it
    run, logs = released_run(run_rankguard, tmp_path, SUITE, selection,
                             launcher_args=("--max-restarts", "1"))
    for rank in (0, 1):
        assert "Interrupted: rankguard: every rank stops (see above)" in logs[rank], \
            logs[rank][-3000:]
        assert DIFFERENCE in logs[rank], logs[rank][-3000:]
        assert all(outcome(logs[rank], test) is None for test in TESTS), logs[rank][-3000:]
    assert "assert 110.0" not in logs[0] + logs[1]
    assert run.code != 0 and run.wall_s < 40
    # the selection's mistake, which a restart would make again: not restarted (--max-restarts 1)
    assert not [e for e in run.events if e["event"] == "restart"], run.stderr
    assert "usage_error" in run.outcomes().values(), run.outcomes()
    assert "stopped on a usage error: rankguard: the ranks collected different tests" \
        in run.stderr, run.stderr


@pytest.mark.slow  # waits out a shutdown timeout (8 s)
def test_under_rankguard_run_a_rank_that_never_comes_to_compare_is_named_with_the_likely_whys(
        run_rankguard, tmp_path: Path) -> None:
    # rank 0 only lists the tests (and ends): rank 1 waits for it until the shutdown timeout
    run, logs = released_run(run_rankguard, tmp_path, SUITE, COLLECT_ONLY_ON_RANK0)
    assert ("rankguard: rank 0 did not come to compare its collected tests within 5 s "
            "(rankguard_shutdown_timeout): still collecting, stuck, or not comparing (its session "
            "has --collect-only or -p no:rankguard); every rank stops") in logs[1], logs[1][-3000:]
    assert all(outcome(logs[1], test) is None for test in TESTS), logs[1][-3000:]
    assert run.code != 0 and run.wall_s < 40

def write_suite(folder: Path) -> Path:
    folder.mkdir()
    (folder / "conftest.py").write_text(textwrap.dedent(CONFTEST)
                                        + textwrap.dedent(OTHER_TESTS_ON_RANK1))
    (folder / "test_suite.py").write_text(textwrap.dedent(SUITE))
    return folder


def pytest_args(suite: Path) -> list[str]:
    return ["-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:timeout",
            "--rootdir", str(suite), "--rankguard-deadline", "60",
            "-o", "rankguard_shutdown_timeout=10", str(suite)]


def check_every_rank_stopped(output: str, explained: range = range(2, 3)) -> None:
    assert output.count(DIFFERENCE) in explained, output[-5000:]
    assert "assert 110.0" not in output, output[-5000:]


@pytest.mark.slow  # two ranks under torchrun (4 s)
def test_under_torchrun_ranks_that_collected_other_tests_stop_before_any_test_naming_them(
        tmp_path: Path) -> None:
    suite = write_suite(tmp_path / "suite")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           "2", "--master-port", str(free_port()), *pytest_args(suite)],
                          cwd=str(suite), capture_output=True, text=True, timeout=RUN_S,
                          start_new_session=True)
    output = done.stdout + done.stderr
    # torchrun stops the other rank once one exits: on a loaded machine, before it prints
    check_every_rank_stopped(output, explained=range(1, 3))
    assert not re.search(r"^(PASSED|FAILED) ", output, re.M), output[-5000:]  # no test ran
    assert done.returncode != 0 and time.monotonic() - started < 40


@pytest.mark.slow  # two ranks of pytest (5 s)
def test_without_a_launcher_store_ranks_that_collected_other_tests_stop_at_the_first_call(
        tmp_path: Path) -> None:
    # RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set by hand (as a batch system's script
    # does): rank 0 hosts the store in its init_process_group, so the ranks compare there
    suite = write_suite(tmp_path / "suite")
    env = {key: value for key, value in os.environ.items()
           if key != "TORCHELASTIC_USE_AGENT_STORE"}
    env.update(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    started = time.monotonic()
    ranks = [subprocess.Popen([sys.executable, *pytest_args(suite)], cwd=str(suite),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True,
                              env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)})
             for rank in (0, 1)]
    outputs = []
    try:
        for proc in ranks:
            outputs.append(proc.communicate(timeout=max(1.0, RUN_S - (time.monotonic()
                                                                      - started)))[0])
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proctree.signal_tree(proc.pid, 9)
                proc.communicate(timeout=10)
    check_every_rank_stopped("".join(outputs))
    assert [proc.returncode for proc in ranks] == [2, 2]  # pytest's "Interrupted"
    assert time.monotonic() - started < 40
