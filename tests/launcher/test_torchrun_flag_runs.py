"""torchrun's flags that change what a run does, in real runs: ``--no-python`` runs an
executable as each rank, ``--redirects``/``--tee``/``--local-ranks-filter`` choose what of each
local rank's output reaches the terminal (the rank logs always keep all of it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import script

TWO_STREAMS = script("two_streams.py")


def _executable(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o700)
    return str(path)


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_no_python_runs_the_executable_itself_as_each_rank(run_rankguard, tmp_path):
    wrapper = _executable(tmp_path / "rank.sh", (
        "#!/bin/sh\n"
        "echo \"rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE role=$ROLE_NAME\"\n"
        "echo \"cmdline=$(tr '\\0' ' ' < /proc/$$/cmdline)\"\n"
        "[ \"$RANK\" = 1 ] && exit 3\n"
        "exit 0\n"))
    run = run_rankguard(["--nproc-per-node", "2", "--no-python", "--role", "trainer", wrapper,
                         "an-arg"], timeout=60)
    assert run.code == 1, run.stderr
    for rank in range(2):
        assert f"[rank{rank}]:rank={rank} local={rank} world=2 role=trainer" in run.stdout
    # the rank process became the executable (exec): the shell runs it, no python around it
    assert f"[rank0]:cmdline=/bin/sh {wrapper} an-arg \n" in run.stdout, run.stdout
    assert run.outcomes() == {0: "ok", 1: "exited"}, run.stderr
    assert "rank 1 exited with code 3" in run.stderr


@pytest.mark.slow  # about 5 s: a hang verdict after --hang-timeout
def test_no_python_wrapper_whose_python_calls_init_is_watched_for_hangs(run_rankguard, tmp_path):
    wrapper = _executable(tmp_path / "rank.sh", (
        f"#!/bin/sh\nexec {sys.executable} {script('init_then_hang.py')}\n"))
    run = run_rankguard(["--nproc-per-node", "2", "--no-python", "--hang-timeout", "2",
                         wrapper], timeout=90)
    assert run.code == 3, run.stderr
    assert "rank 1 never reached all_reduce #4 (made no progress)" in run.stderr


def _lines(text: str, marker: str) -> list[str]:
    return sorted(line for line in text.splitlines() if marker in line)


def _assert_logs_complete(run) -> None:
    for rank in range(2):
        log = (run.log_dir / "attempt0" / f"rank{rank}.log").read_text()
        assert f"out rank={rank} sum=2" in log and f"err rank={rank}" in log


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_local_ranks_filter_shows_only_those_ranks_and_the_logs_keep_all(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", "--local-ranks-filter", "1", TWO_STREAMS])
    assert run.code == 0, run.stderr
    assert _lines(run.stdout, "out rank=") == ["[rank1]:out rank=1 sum=2 role=default"]
    assert _lines(run.stderr, "err rank=") == ["[rank1]:err rank=1 local_rank=1"]
    _assert_logs_complete(run)


@pytest.mark.slow  # 3 s; local ranks filter stays quick
def test_redirects_keep_streams_off_the_terminal_unless_teed(run_rankguard):
    # every stream to the log only, but local rank 0's stdout teed: torchrun's precedence
    run = run_rankguard(["--nproc-per-node", "2", "--redirects", "3", "--tee", "0:1",
                         TWO_STREAMS])
    assert run.code == 0, run.stderr
    assert _lines(run.stdout, "out rank=") == ["[rank0]:out rank=0 sum=2 role=default"]
    assert _lines(run.stderr, "err rank=") == []
    assert "succeeded" in run.stderr  # the launcher's own lines still show
    _assert_logs_complete(run)


@pytest.mark.slow  # 3 s; local ranks filter stays quick
def test_redirecting_stderr_keeps_stdout_on_the_terminal(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", "-r", "2", TWO_STREAMS])
    assert run.code == 0, run.stderr
    assert len(_lines(run.stdout, "out rank=")) == 2
    assert _lines(run.stderr, "err rank=") == []
    _assert_logs_complete(run)
