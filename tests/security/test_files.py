"""Files rankguard makes where other users could reach them: ledgers, stack dumps, the default
log folder. A symlink or file planted at a predictable path is never followed; what a run writes
is private to its user; and nothing is left behind, even by a SIGKILLed launcher.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from rankguard.records import ledger
from rankguard.processes import proctree
from rankguard.runtime import stacks

from ..conftest import ROOT, finish, launch, script

NOBODY = 65534
PRECIOUS = "the test's own file; nobody may write through a link to it\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text(PRECIOUS)
    return victim


def _await_text(path: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return path.read_text()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# -- ledgers -------------------------------------------------------------------------------------

def test_creating_a_ledger_replaces_a_planted_symlink_instead_of_writing_through_it(
        tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    path = tmp_path / "rank0.ledger"
    path.symlink_to(victim)
    ledger.create(str(path), 2)
    assert victim.read_text() == PRECIOUS
    assert stat.S_ISREG(path.lstat().st_mode) and _mode(path) == 0o600
    reader = ledger.LedgerReader(str(path))
    assert len(reader.read().groups) == 1  # a real ledger, with its world slot
    reader.close()


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_the_launcher_ignores_ledgers_planted_at_predictable_paths_and_keeps_its_own_private(
        tmp_path: Path, run_rankguard) -> None:
    victim = _victim(tmp_path)
    run_id = f"rg-sec-{uuid.uuid4().hex[:8]}"
    planted = [Path(ledger.default_dir()) / f"rankguard-{run_id}-0-{rank}.ledger"
               for rank in (0, 1)]  # paths anyone can guess from the run id
    for link in planted:
        link.symlink_to(victim)
    try:
        report = tmp_path / "ledger"
        run = run_rankguard(["--run-id", run_id, "--nproc-per-node", "2",
                             script("report_ledger.py"), str(report)])
        used = [Path(_await_text(Path(f"{report}.rank{rank}"))) for rank in (0, 1)]
    finally:
        for link in planted:
            link.unlink(missing_ok=True)
    assert run.code == 0, run.stderr
    assert victim.read_text() == PRECIOUS
    folder = used[0].parent
    assert used[1].parent == folder and folder.parent == Path(ledger.default_dir())
    assert folder.name.startswith(f"rankguard-ledgers-{run_id}-") and not folder.exists(), folder


def test_a_sigkilled_launcher_leaves_no_ledger_behind(tmp_path: Path) -> None:
    report = tmp_path / "ledger"
    proc = launch(["--nproc-per-node", "2", script("report_ledger.py"), str(report), "600"],
                  tmp_path / "logs")
    started = time.monotonic()
    try:
        used = [Path(_await_text(Path(f"{report}.rank{rank}"))) for rank in (0, 1)]
        assert all(path.exists() for path in used)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        deadline = time.monotonic() + 10  # the guardian's sweep, then its cleanup
        while any(path.exists() for path in used) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [path for path in used if path.exists()] + [
            path.parent for path in used if path.parent.name.startswith("rankguard-ledgers-")
            and path.parent.exists()]
    finally:
        if proc.poll() is None:
            finish(proc, tmp_path / "logs", 1, started)
    for path in left:  # a failing run must not leave them to the next one
        if path.is_dir():
            path.rmdir()
        else:
            path.unlink(missing_ok=True)
    assert left == []


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_ledgers_of_a_launcher_killed_with_its_guardian_are_removed_by_the_next_run(
        tmp_path: Path, run_rankguard) -> None:
    report = tmp_path / "ledger"
    proc = launch(["--nproc-per-node", "1", script("report_ledger.py"), str(report), "600"],
                  tmp_path / "logs")
    used = Path(_await_text(Path(f"{report}.rank0")))
    proctree.signal_tree(proc.pid, signal.SIGKILL)  # the launcher, its guardian, its ranks
    proc.communicate(timeout=10)
    left = used.parent if used.parent.name.startswith("rankguard-ledgers-") else used
    assert left.exists()
    long_ago = time.time() - 3600
    os.utime(left, (long_ago, long_ago))
    try:
        run = run_rankguard(["--nproc-per-node", "1", script("sleeper.py"), "0"])
        assert run.code == 0, run.stderr
        assert not left.exists()
    finally:
        if left.is_dir():
            shutil.rmtree(left)
        else:
            left.unlink(missing_ok=True)


def test_a_ledger_folder_that_its_process_still_holds_is_never_swept(tmp_path: Path) -> None:
    held = Path(ledger.make_dir("held"))  # this process holds it
    long_ago = time.time() - 3600
    os.utime(held, (long_ago, long_ago))
    fresh = Path(ledger.make_dir("fresh"))  # sweeps what nobody holds
    try:
        assert held.is_dir() and fresh.is_dir()
    finally:
        shutil.rmtree(held)
        shutil.rmtree(fresh)


# -- stack dumps ---------------------------------------------------------------------------------

def _stacks_child(mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, script("stacks_child.py"), mode], cwd=str(ROOT),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _ready(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.stdout.readline() == "ready\n"  # bounded by the plugin's deadline


def test_init_does_not_dump_stacks_through_a_symlink_planted_at_a_predictable_path(
        tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    child = _stacks_child("wait")
    planted = Path(tempfile.gettempdir()) / f"rankguard-stacks-{child.pid}.txt"  # the old one
    planted.symlink_to(victim)
    try:
        _ready(child)
        path = Path(stacks.path_for(child.pid, {}))
        proctree.signal_main_thread(child.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while "stacks_child.py" not in (path.read_text() if path.exists() else ""):
            assert time.monotonic() < deadline, "no stack dump"
            time.sleep(0.02)
        child.communicate("\n", timeout=30)
    finally:
        planted.unlink(missing_ok=True)
        child.kill()
        child.wait()
    assert victim.read_text() == PRECIOUS
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert path.parent.lstat().st_uid == os.geteuid() and path != planted
    path.unlink()


@pytest.mark.parametrize("end", ["exit", "sigterm", pytest.param("sigkill", marks=pytest.mark.slow)])
def test_init_leaves_no_empty_stacks_file_behind(end: str) -> None:
    child = _stacks_child("exit" if end == "exit" else "wait")
    path = Path(stacks.path_for(child.pid, {}))
    _ready(child)
    assert path.exists()  # faulthandler needs it open from init() on
    if end != "exit":
        child.send_signal(signal.SIGTERM if end == "sigterm" else signal.SIGKILL)
    child.communicate(timeout=30)
    assert child.returncode == {"exit": 0, "sigterm": 0, "sigkill": -signal.SIGKILL}[end]
    if end == "sigkill":  # it had no chance: the next process of this user that starts removes it
        assert path.exists()
        successor = _stacks_child("exit")
        _ready(successor)
        successor.communicate(timeout=30)
    assert not path.exists()


# -- the default log folder ----------------------------------------------------------------------

def _run_with_default_log_dir(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "rankguard.cli", "run", "--master-port", "0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), timeout=90,
                          env={**os.environ, "TMPDIR": str(tmp)})


@pytest.mark.parametrize("problem", ["owned by nobody", "world-writable", "a symlink"])
def test_a_default_log_folder_that_is_not_private_is_refused_with_exit_2(
        tmp_path: Path, problem: str) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    shared = tmp / f"rankguard-{os.geteuid()}"
    if problem == "a symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        shared.symlink_to(tmp_path / "elsewhere")
    else:
        shared.mkdir(mode=0o700)
        if problem == "world-writable":
            shared.chmod(0o777)
        else:
            os.chown(shared, NOBODY, NOBODY)
    started = tmp_path / "started"
    done = _run_with_default_log_dir(tmp, "--nproc-per-node", "1", script("report_ledger.py"),
                                     str(started))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--log-dir" in lines[0] and str(shared) in lines[0], done.stderr
    assert not list(tmp_path.glob("started*"))  # nothing was started


def test_a_run_keeps_its_default_log_folder_and_files_private(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = _run_with_default_log_dir(tmp, "--nproc-per-node", "2", "--run-id", "private",
                                     script("report_ledger.py"), str(tmp_path / "ledger"))
    assert done.returncode == 0, done.stderr
    mine = tmp / f"rankguard-{os.geteuid()}"
    folders = [mine, *[p for p in mine.rglob("*") if p.is_dir()]]
    files = [p for p in mine.rglob("*") if not p.is_dir()]
    assert {p.name for p in files} >= {"journal.jsonl", "rank0.log", "rank1.log",
                                       "stacks_rank0.txt"}, files
    assert {str(p): oct(_mode(p)) for p in folders if _mode(p) != 0o700} == {}
    assert {str(p): oct(_mode(p)) for p in files if _mode(p) != 0o600} == {}
