"""A pool's log folder given by the user (``rankguard serve --log-dir``, ``Pool(log_dir=)``), as
``rankguard run --log-dir`` treats its own: taken where the user puts it, even in a folder
their group can write (one that others can write is refused: ``test_log_dir``), but what the
pool makes in it is private (group folders 0700, files 0600), and a link or someone else's
folder planted at a group folder's name (by a member of the group) is refused, never written
through.

Real pools and a real ``rankguard serve`` process; another uid by ``os.chown`` (tests run as
root)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

import rankguard

from ..serving import rank_functions as rf
from ..serving.test_serve import Server

NOBODY = 65534
TIMEOUT = 10.0


def _modes(folder: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The folders below ``folder`` not 0700 and the files not 0600, with their modes."""
    made = list(folder.rglob("*"))
    return ({str(p): oct(stat.S_IMODE(p.lstat().st_mode)) for p in made
             if p.is_dir() and stat.S_IMODE(p.lstat().st_mode) != 0o700},
            {str(p): oct(stat.S_IMODE(p.lstat().st_mode)) for p in made
             if p.is_file() and stat.S_IMODE(p.lstat().st_mode) != 0o600})


def _group_writable(folder: Path) -> Path:
    """A team's shared folder: its group may write it, others not."""
    folder.mkdir()
    folder.chmod(0o775)
    return folder


def test_a_pools_group_folders_and_files_are_private_in_a_log_dir_its_group_can_write(
        tmp_path: Path) -> None:
    logs = _group_writable(tmp_path / "logs")
    with rankguard.Pool(2, spares=1, timeout=TIMEOUT, log_dir=str(logs)) as pool:
        pool.run(rf.pid)
        groups = sorted(p.name for p in logs.iterdir() if p.name.startswith("group"))
        modes = _modes(logs)
    assert groups == ["group1", "group2"], groups
    assert modes == ({}, {}), modes
    assert stat.S_IMODE(logs.stat().st_mode) == 0o775  # the user's folder is theirs to set


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.parametrize("planted", ["a symlink", "a folder of nobody's"])
def test_a_pool_refuses_what_is_planted_at_a_group_folders_name_and_starts_the_next(
        tmp_path: Path, planted: str) -> None:
    logs = _group_writable(tmp_path / "logs")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if planted == "a symlink":
        (logs / "group1").symlink_to(elsewhere)
    else:
        (logs / "group1").mkdir(mode=0o777)
        os.chown(logs / "group1", NOBODY, NOBODY)
    journal = tmp_path / "journal.jsonl"
    with rankguard.Pool(1, spares=0, timeout=TIMEOUT, log_dir=str(logs),
                        journal=str(journal)) as pool:
        pool.run(rf.pid)
        assert (logs / "group2" / "rank0.log").is_file()
    assert list(elsewhere.iterdir()) == [] and list((logs / "group1").iterdir()) == []
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    failed = [e for e in events if e.get("group") == 1 and "detail" in e]
    assert failed and str(logs / "group1") in failed[0]["detail"], events


@pytest.mark.slow
@pytest.mark.deadline(180)
def test_serve_keeps_its_group_folders_and_files_private_in_a_log_dir_its_group_can_write(
        tmp_path: Path) -> None:
    logs = _group_writable(tmp_path / "logs")  # Server gives --log-dir tmp_path/logs
    server = Server(tmp_path)
    try:
        assert server.run({"x": [1.0] * 8}).status == 200
        groups = sorted(p.name for p in logs.iterdir() if p.name.startswith("group"))
        modes = _modes(logs)
    finally:
        assert server.stop() == 0
    assert len(groups) >= 2, groups  # a replica and a spare
    assert modes == ({}, {}), modes
