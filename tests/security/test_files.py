"""Files rankguard makes where other users could reach them: ledgers, stack dumps, the default
log folder. A symlink or file planted at a predictable path is never followed; what a run writes
is private to its user; and nothing is left behind, even by a SIGKILLed launcher.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import time
import uuid
from pathlib import Path

import pytest

from rankguard import ledger, proctree

from ..conftest import finish, launch, script

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


def test_the_launcher_ignores_ledgers_planted_at_predictable_paths_and_keeps_its_own_private(
        tmp_path: Path, run_rankguard) -> None:
    victim = _victim(tmp_path)
    run_id = f"rg-sec-{uuid.uuid4().hex[:8]}"
    planted = [Path(ledger.default_dir()) / f"rankguard-{run_id}-0-{rank}.ledger"
               for rank in (0, 1)]  # where earlier versions put them
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
