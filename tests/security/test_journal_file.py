"""A journal the user names (``rankguard run --journal``, ``rankguard serve --journal``,
``Pool(journal=)``) may be in a folder others can write, such as ``/tmp``: there anyone may take
the name first. What is found at the name must be a file of the user's with no other name: a
symlink, a file of another user's, or a hard link to one of the user's files is refused (exit 2,
one line naming it), never written through; a missing one is created 0600.

Real files in a real sticky world-writable folder (as ``/tmp``), another uid by ``os.chown``
(the tests run as root), real ``rankguard run`` and ``rankguard serve`` processes, a real
Pool."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import rankguard
from rankguard.errors import UsageError
from rankguard.records.journal import Journal

from ..conftest import ROOT, script

NOBODY = 65534
THEIRS = "a file planted first; nothing of the run may land in it\n"
PLANTED = ["a symlink", "a file of another user's", "a hard link to a file of mine"]
PROBLEM = {"a symlink": "is a symbolic link (not followed",
           "a file of another user's": f"belongs to uid {NOBODY}, not to you",
           "a hard link to a file of mine": "has 2 names (hard links)"}


def _shared(tmp_path: Path) -> Path:
    """A folder as ``/tmp`` is: anyone may create a file in it (sticky, 1777)."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def _plant(journal: Path, kind: str, tmp_path: Path) -> Path:
    """Put ``kind`` at ``journal``'s name, as another user could first; returns the file that a
    journal written through it would change."""
    victim = tmp_path / "victim.txt"
    victim.write_text(THEIRS)
    if kind == "a symlink":
        journal.symlink_to(victim)
        return victim
    if kind == "a hard link to a file of mine":
        os.link(victim, journal)
        return victim
    journal.write_text(THEIRS)
    journal.chmod(0o666)
    os.chown(journal, NOBODY, NOBODY)
    return journal


def _cli(command: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rankguard.cli", command, *args],
                          capture_output=True, text=True, cwd=str(ROOT), timeout=90)


def _refused(done: subprocess.CompletedProcess[str], prog: str, journal: Path,
             kind: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{prog}: error: --journal: {str(journal)!r} {PROBLEM[kind]}"), \
        lines


@pytest.mark.parametrize("kind", PLANTED)
def test_run_refuses_what_is_planted_at_its_journals_name_in_a_shared_folder(
        tmp_path: Path, kind: str) -> None:
    journal = _shared(tmp_path) / "journal.jsonl"
    written = _plant(journal, kind, tmp_path)
    started = tmp_path / "started"
    done = _cli("run", "--master-port", "0", "--log-dir", str(tmp_path / "logs"),
                "--journal", str(journal), "--nproc-per-node", "1",
                script("report_ledger.py"), str(started))
    _refused(done, "rankguard run", journal, kind)
    assert written.read_text() == THEIRS
    assert not list(tmp_path.glob("started*"))  # nothing was started


@pytest.mark.parametrize("kind", ["a file of another user's", "a hard link to a file of mine"])
def test_serve_refuses_what_is_planted_at_its_journals_name(tmp_path: Path, kind: str) -> None:
    journal = _shared(tmp_path) / "journal.jsonl"
    written = _plant(journal, kind, tmp_path)
    done = _cli("serve", "examples/serve_tp.py:app", "--port", "0", "--journal", str(journal))
    _refused(done, "rankguard serve", journal, kind)
    assert "listening" not in done.stdout and written.read_text() == THEIRS


@pytest.mark.parametrize("kind", PLANTED)
def test_a_pool_refuses_what_is_planted_at_its_journals_name(tmp_path: Path, kind: str) -> None:
    journal = _shared(tmp_path) / "journal.jsonl"
    written = _plant(journal, kind, tmp_path)
    with pytest.raises(UsageError) as refused:
        rankguard.Pool(1, spares=0, timeout=10.0, journal=str(journal))
    assert refused.value.what == "Pool(journal)" and str(journal) in refused.value.problem
    assert written.read_text() == THEIRS


@pytest.mark.parametrize("kind", PLANTED)
def test_a_journal_planted_after_the_check_is_refused_when_opened(tmp_path: Path,
                                                                  kind: str) -> None:
    journal = _shared(tmp_path) / "journal.jsonl"
    written = _plant(journal, kind, tmp_path)  # as if between the launcher's check and its open
    with pytest.raises(OSError) as refused:
        Journal(str(journal), "planted")
    assert refused.value.errno == (errno.ELOOP if kind == "a symlink" else errno.EPERM)
    assert written.read_text() == THEIRS


def test_run_keeps_its_journal_in_a_shared_folder_private(tmp_path: Path) -> None:
    journal = _shared(tmp_path) / "journal.jsonl"
    done = _cli("run", "--master-port", "0", "--log-dir", str(tmp_path / "logs"),
                "--journal", str(journal), "--nproc-per-node", "1", script("sleeper.py"), "0")
    assert done.returncode == 0, done.stderr
    info = journal.lstat()
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == os.geteuid() and '"event": "run_end"' in journal.read_text()
