"""What ``rankguard report``, ``flight-recorder`` and ``status`` read and write where other users
could reach it: the runs' folder they search (``$TMPDIR/rankguard-UID``) is refused as
``rankguard run`` refuses it, and what they write goes only into a folder of the user's own,
never through a symlink planted where a folder is expected.

Real folders, real modes and owners (another uid by ``os.chown``: the tests run as root), the
real commands as subprocesses.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT

NOBODY = 65534
T = 1_800_000_000.0  # a wall-clock time
RUN = [
    {"event": "run_start", "ts": T, "run_id": "planted", "nproc": 2},
    {"event": "attempt_start", "ts": T + 0.1, "attempt": 0},
    {"event": "rank_start", "ts": T + 0.1, "attempt": 0, "rank": 0, "pid": 10},
    {"event": "rank_start", "ts": T + 0.1, "attempt": 0, "rank": 1, "pid": 11},
    {"event": "attempt_end", "ts": T + 6.3, "attempt": 0, "fault": "hung", "rank": 1,
     "root_cause": "hang: rank 1 never reached all_reduce #2"},
    {"event": "run_end", "ts": T + 9.0, "status": "failed", "exit_code": 3,
     "root_cause": "hang: rank 1 never reached all_reduce #2"},
]


def _plant_run(folder: Path) -> Path:
    """A run's log folder as ``rankguard run`` leaves it: its journal and each rank's recent
    operations (``records/recent_file``'s format), enough for every command."""
    (folder / "attempt0").mkdir(parents=True, mode=0o700)
    (folder / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in RUN))
    for rank in (0, 1):
        ops = [{"n": n, "op": "all_reduce", "seq": n, "world": True, "group": f"{1:016x}",
                "members": [0, 1], "t_enter": T + n, "t_done": T + n + 0.1 if rank == 0 or n < 2
                else None} for n in (1, 2)]
        (folder / "attempt0" / f"recent_rank{rank}.json").write_text(json.dumps(
            {"format": 1, "rank": rank, "attempt": 0, "pid": 10 + rank, "ops": ops}))
    return folder


def _rankguard(*args: str, tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    return subprocess.run([sys.executable, "-m", "rankguard.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``folder`` (not following links), with its mode and size."""
    return {str(p.relative_to(folder)): (p.lstat().st_mode, p.lstat().st_size)
            for p in folder.rglob("*")}


def _one_line(done: subprocess.CompletedProcess[str], *words: str) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert all(word in lines[0] for word in words), (words, lines[0])
    return lines[0]


def _unsafe(folder: Path, problem: str, elsewhere: Path) -> None:
    """Make ``folder`` (with a run in it) one that others can write or own, or a symlink."""
    if problem == "a symlink":
        _plant_run(elsewhere / "planted")
        folder.symlink_to(elsewhere)
        return
    folder.mkdir(mode=0o700)
    _plant_run(folder / "planted")
    if problem == "world-writable":
        folder.chmod(0o777)
    else:
        os.chown(folder, NOBODY, NOBODY)


# -- the runs' folder ----------------------------------------------------------------------------

@pytest.mark.parametrize("problem", ["world-writable", "owned by nobody", "a symlink"])
@pytest.mark.parametrize("command", ["report", "flight-recorder", "status"])
@pytest.mark.parametrize("which", [[], ["planted"]], ids=["the latest run", "a RUN_ID"])
def test_a_runs_folder_that_is_not_private_is_refused_before_reading_or_writing_in_it(
        tmp_path: Path, problem: str, command: str, which: list[str]) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    shared = tmp / f"rankguard-{os.geteuid()}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    _unsafe(shared, problem, elsewhere)
    before = _tree(tmp_path)
    done = _rankguard(command, *which, tmp=tmp)
    _one_line(done, f"rankguard {command}: error: RUN: {str(shared)!r}", "or give the run's "
              "--log-dir or journal file")
    assert done.stdout == ""
    assert _tree(tmp_path) == before  # nothing written, in the folder or where a link leads


def test_a_private_runs_folder_still_gives_the_latest_run(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    mine = tmp / f"rankguard-{os.geteuid()}"
    mine.mkdir(parents=True, mode=0o700)
    _plant_run(mine / "planted")
    done = _rankguard("report", tmp=tmp)
    assert done.returncode == 0, done.stderr
    assert (mine / "planted" / "report.html").is_file()


# -- output into a run folder the user names -----------------------------------------------------

@pytest.mark.parametrize("problem, words", [
    ("world-writable", ["can be written by other users (mode 0777)", "(chmod 700 "]),
    ("owned by nobody", [f"belongs to uid {NOBODY}, not to you"])])
def test_a_run_the_user_names_in_a_folder_others_can_write_is_read_but_nothing_written_there(
        tmp_path: Path, problem: str, words: list[str]) -> None:
    run = _plant_run(tmp_path / "shared")
    if problem == "world-writable":
        run.chmod(0o777)
    else:
        os.chown(run, NOBODY, NOBODY)
    before = _tree(run)
    for command in ("report", "flight-recorder"):
        _one_line(_rankguard(command, str(run)), f"rankguard {command}: error: -o: "
                  f"{str(run)!r}", *words)
    assert _tree(run) == before
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    done = _rankguard("report", str(run), "-o", str(mine / "report.html"))
    assert done.returncode == 0, done.stderr  # the run was read: the user named it
    assert stat.S_IMODE((mine / "report.html").stat().st_mode) == 0o600
    dumps = _rankguard("flight-recorder", str(run), "-o", str(mine / "fr"))
    assert dumps.returncode == 0, dumps.stderr
    assert sorted(p.name for p in (mine / "fr").iterdir()) == ["rank_0", "rank_1"]
    assert stat.S_IMODE((mine / "fr").stat().st_mode) == 0o700


def test_a_report_is_not_written_into_a_shared_folder_like_tmp(tmp_path: Path) -> None:
    run = _plant_run(tmp_path / "run")
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # as /tmp: anyone may put a file of theirs at the name first
    _one_line(_rankguard("report", str(run), "-o", str(sticky / "report.html")),
              f"{str(sticky)!r} can be written by other users (mode 1777)")
    assert list(sticky.iterdir()) == []


# -- links planted where an output folder is expected --------------------------------------------

@pytest.mark.parametrize("planted", ["flight_recorder", "flight_recorder/attempt0"])
def test_flight_recorder_refuses_a_symlink_planted_at_its_output_folder(
        tmp_path: Path, planted: str) -> None:
    run = _plant_run(tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "attempt0").mkdir(parents=True, mode=0o700)  # what a link at either leads to
    link = run / planted
    link.parent.mkdir(exist_ok=True, mode=0o700)
    link.symlink_to(elsewhere if planted == "flight_recorder" else elsewhere / "attempt0")
    before = _tree(elsewhere)
    _one_line(_rankguard("flight-recorder", str(run)), f"-o: {str(link)!r} is a symlink, not a "
              "folder of yours")
    assert _tree(elsewhere) == before  # no rank_0, rank_1 there


def test_an_output_folder_given_as_a_symlink_is_refused(tmp_path: Path) -> None:
    run = _plant_run(tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    _one_line(_rankguard("flight-recorder", str(run), "-o", str(link)),
              f"-o: {str(link)!r} is a symlink")
    _one_line(_rankguard("report", str(run), "-o", str(link / "report.html")),
              f"-o: {str(link)!r} is a symlink")
    assert list(elsewhere.iterdir()) == []
    made = _rankguard("flight-recorder", str(run), "-o", str(tmp_path / "new" / "fr"))
    assert made.returncode == 0, made.stderr  # what it makes itself is fine
    assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "new", tmp_path / "new" / "fr")
            } == {0o700}
