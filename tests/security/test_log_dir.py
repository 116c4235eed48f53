"""A log folder the user names (``rankguard run --log-dir``, ``rankguard serve --log-dir``,
``Pool(log_dir=)``) must be theirs, and others must not be able to write it: whoever can write
it can plant links at the names rankguard writes (``journal.jsonl``, ``attemptN/``) or read what
the ranks wrote. One that another user owns, or that others can write (0777, ``/tmp`` itself),
is refused before anything starts (exit 2, one line naming the folder and the fix); a folder the
user's group can write (a team's shared folder, 0775 or 2775) is fine.

Real folders, real modes and owners (another uid by ``os.chown``: the tests run as root), real
``rankguard run`` and ``rankguard serve`` processes, a real Pool."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import rankguard
from rankguard.errors import UsageError

from ..conftest import ROOT, finish, launch, script

NOBODY = 65534
TIMEOUT = 10.0


def _folder(tmp_path: Path, kind: str) -> Path:
    """A folder of ``kind`` that exists before the run (``/tmp itself``: the real temp folder)."""
    if kind == "/tmp itself":
        return Path(tempfile.gettempdir())
    folder = tmp_path / "logs"
    folder.mkdir()
    if kind == "world-writable (0777)":
        folder.chmod(0o777)
    elif kind == "world-writable and sticky (1777)":
        folder.chmod(0o1777)
    elif kind == "owned by another user":
        os.chown(folder, NOBODY, NOBODY)
    elif kind == "a symlink of another user's to a folder of mine":
        mine = tmp_path / "mine"
        mine.mkdir(mode=0o700)
        folder.rmdir()
        folder.symlink_to(mine)
        os.lchown(folder, NOBODY, NOBODY)
    return folder


WRITTEN = {"journal.jsonl", "attempt0", "group1", "zygote.log"}  # what a run or a pool writes


def _new(folder: Path, before: set[str]) -> set[str]:
    """What rankguard would have written in ``folder`` that is there now and was not before
    (``/tmp`` itself: other processes' files come and go meanwhile)."""
    return (set(os.listdir(folder)) - before) & WRITTEN


REFUSED = ["world-writable (0777)", "world-writable and sticky (1777)", "/tmp itself",
           "owned by another user", "a symlink of another user's to a folder of mine"]


def _cli(command: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rankguard.cli", command, *args],
                          capture_output=True, text=True, cwd=str(ROOT), timeout=90)


def _refused_in_one_line(done: subprocess.CompletedProcess[str], prog: str, folder: Path) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{prog}: error: --log-dir: {str(folder)!r}"), lines
    assert "chmod o-w" in lines[0] or "choose a folder of your own" in lines[0], lines


@pytest.mark.parametrize("kind", REFUSED)
def test_run_refuses_a_log_dir_others_can_write_or_own_and_writes_nothing_there(
        tmp_path: Path, kind: str) -> None:
    folder = _folder(tmp_path, kind)
    before = set(os.listdir(folder))
    started = tmp_path / "started"
    done = _cli("run", "--master-port", "0", "--run-id", f"refused{os.getpid()}",
                "--log-dir", str(folder), "--nproc-per-node", "1",
                script("report_ledger.py"), str(started))
    _refused_in_one_line(done, "rankguard run", folder)
    assert _new(folder, before) == set()
    assert not list(tmp_path.glob("started*"))  # nothing was started


@pytest.mark.parametrize("kind", ["world-writable (0777)", "owned by another user"])
def test_serve_refuses_a_log_dir_others_can_write_or_own(tmp_path: Path, kind: str) -> None:
    folder = _folder(tmp_path, kind)
    done = _cli("serve", "examples/serve_tp.py:app", "--port", "0", "--log-dir", str(folder))
    _refused_in_one_line(done, "rankguard serve", folder)
    assert "listening" not in done.stdout and list(folder.iterdir()) == []


@pytest.mark.parametrize("kind", REFUSED)
def test_a_pool_refuses_a_log_dir_others_can_write_or_own(tmp_path: Path, kind: str) -> None:
    folder = _folder(tmp_path, kind)
    before = set(os.listdir(folder))
    with pytest.raises(UsageError) as refused:
        rankguard.Pool(1, spares=0, timeout=TIMEOUT, log_dir=str(folder))
    assert refused.value.what == "Pool(log_dir)" and str(folder) in refused.value.problem
    assert _new(folder, before) == set()


def test_run_writes_into_a_log_dir_its_group_can_write(tmp_path: Path) -> None:
    folder = tmp_path / "team"
    folder.mkdir()
    folder.chmod(0o2775)  # a team's shared folder: the group writes, others do not
    done = _cli("run", "--master-port", "0", "--log-dir", str(folder), "--nproc-per-node", "1",
                script("sleeper.py"), "0")
    assert done.returncode == 0, done.stderr
    assert (folder / "journal.jsonl").is_file() and (folder / "attempt0" / "rank0.log").is_file()


# -- the folders a run makes in it ---------------------------------------------------------------

def _planted(at: Path, kind: str, tmp_path: Path) -> Path:
    """Plant ``kind`` at ``at`` as another user could, first; returns the folder that a run
    writing through it would write into."""
    if kind == "a symlink":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        at.symlink_to(elsewhere)
        return elsewhere
    at.mkdir(mode=0o777)
    os.chown(at, NOBODY, NOBODY)
    return at


def _refused_folder(done: subprocess.CompletedProcess[str], folder: Path) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert f"--log-dir: {str(folder)!r}" in lines[0], lines


@pytest.mark.parametrize("kind", ["a symlink", "a folder of another user's"])
def test_run_refuses_what_is_planted_at_an_attempt_folders_name_and_writes_nothing_through_it(
        tmp_path: Path, kind: str) -> None:
    logs = tmp_path / "team"
    logs.mkdir()
    logs.chmod(0o775)  # a member of the group could plant
    written = _planted(logs / "attempt0", kind, tmp_path)
    started = tmp_path / "started"
    done = _cli("run", "--master-port", "0", "--log-dir", str(logs), "--nproc-per-node", "1",
                script("report_ledger.py"), str(started))
    _refused_folder(done, logs / "attempt0")
    assert list(written.iterdir()) == []
    assert not list(tmp_path.glob("started*"))  # no rank ran


@pytest.mark.parametrize("kind", ["a symlink", "a folder of another user's"])
def test_run_refuses_what_is_planted_at_its_default_log_folders_name(
        tmp_path: Path, kind: str) -> None:
    tmp = tmp_path / "tmp"
    (tmp / f"rankguard-{os.geteuid()}").mkdir(parents=True, mode=0o700)
    run = tmp / f"rankguard-{os.geteuid()}" / "planted"
    written = _planted(run, kind, tmp_path)
    done = subprocess.run([sys.executable, "-m", "rankguard.cli", "run", "--master-port", "0",
                           "--run-id", "planted", script("sleeper.py"), "0"],
                          capture_output=True, text=True, cwd=str(ROOT), timeout=90,
                          env={**os.environ, "TMPDIR": str(tmp)})
    _refused_folder(done, run)
    assert list(written.iterdir()) == []


@pytest.mark.parametrize("found", [pytest.param("nothing", marks=pytest.mark.slow), "a symlink",
                                   pytest.param("a file of another user's",
                                                marks=pytest.mark.slow)])  # out of the quick run
def test_the_traceback_of_an_internal_error_is_private_and_written_through_no_planted_name(
        tmp_path: Path, found: str) -> None:
    logs = tmp_path / "team"
    logs.mkdir()
    logs.chmod(0o775)  # a member of the group could plant
    target = logs / "internal_error.txt"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    if found == "a symlink":
        target.symlink_to(victim)
    elif found == "a file of another user's":
        target.write_text("theirs\n")
        target.chmod(0o666)
        os.chown(target, NOBODY, NOBODY)
    proc = launch(["--nproc-per-node", "2", "--max-restarts", "1", "--no-spares",
                   script("break_ledger_dir.py")], logs)  # an internal error: exit 4
    run = finish(proc, logs, 60, time.monotonic())
    assert run.code == 4, run.stderr[-2000:]
    if found == "nothing":
        assert f"Traceback: {target}" in run.stderr
        assert stat.S_IMODE(target.stat().st_mode) == 0o600
        assert "Traceback (most recent call last)" in target.read_text()
    else:  # refused: the traceback is kept on stderr, and nothing is written through the name
        assert "Traceback: above" in run.stderr and "Traceback (most recent" in run.stderr
        assert victim.read_text() == "keep\n"
        assert target.is_symlink() or target.read_text() == "theirs\n"
