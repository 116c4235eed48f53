"""What the commands that look at a run find in its folder may have been put there by anyone
who can write it (a rank's own code can): a FIFO, a link to a secret or to an endless device
at the name of a file rankguard wrote. They read none of it through, and end in bounded time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rankguard import cli
from rankguard.processes import stack_summary
from rankguard.records import ledger, recent_file

from ..conftest import ROOT

T = 1_800_000_000.0  # a wall-clock time
SECRET = "only_the_secret_file_holds_this_name"
RUN = [
    {"event": "run_start", "ts": T, "run_id": "planted"},
    {"event": "attempt_start", "ts": T + 0.1, "attempt": 0},
    *({"event": "rank_start", "ts": T + 0.1, "attempt": 0, "rank": r, "pid": 4_000_000 + r}
      for r in range(3)),
    {"event": "run_end", "ts": T + 9.0, "status": "failed", "exit_code": 3},
]


def _dump(function: str) -> str:
    return ("Current thread 0x00007f0000000001 (most recent call first):\n"
            f'  File "/home/u/train.py", line 7 in {function}\n')


def _planted_run(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    (folder / "attempt0").mkdir(parents=True)
    (folder / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in RUN))
    secret = tmp_path / "secret.txt"
    secret.write_text(_dump(SECRET))
    os.mkfifo(folder / "attempt0" / "stacks_rank0.txt")  # nobody ever writes to it
    os.symlink(secret, folder / "attempt0" / "stacks_rank1.txt")
    os.symlink("/dev/zero", folder / "attempt0" / "stacks_rank2.txt")
    return folder


def test_a_stacks_file_that_is_a_fifo_a_link_or_endless_is_not_read(tmp_path: Path) -> None:
    folder = _planted_run(tmp_path)
    for rank in range(3):
        assert stack_summary.last_dump(str(folder / "attempt0" / f"stacks_rank{rank}.txt")) == ""
    big = tmp_path / "big.txt"  # a file of many dumps: its latest ones, in bounded memory
    with open(big, "w") as out:
        out.write(_dump("old") * (stack_summary.DUMPS_LIMIT // 50 + 1) + _dump("newest"))
    text = stack_summary.last_dump(str(big))
    assert len(text) <= stack_summary.DUMPS_LIMIT and text.endswith(_dump("newest"))


def test_rankguard_stacks_of_an_ended_run_reads_nothing_planted_and_ends(tmp_path: Path) -> None:
    folder = _planted_run(tmp_path)
    shown = subprocess.run([sys.executable, "-m", "rankguard.cli", "stacks", "--full",
                            str(folder)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 1, shown  # no rank left stacks of its own
    assert SECRET not in shown.stdout and "Traceback" not in shown.stderr, shown
    assert "ranks 0-2 (3): no stacks" in shown.stdout, shown.stdout


def test_a_journal_of_gigabytes_is_read_in_part_in_bounded_time(tmp_path: Path) -> None:
    """Its first and last MiB only (run_start at one end, the latest attempt at the other),
    said on stderr; before, a 1 GB journal took minutes and 8 GB of memory to show."""
    lines = [json.dumps(e) + "\n" for e in RUN]
    with open(tmp_path / "journal.jsonl", "w") as journal:
        journal.write(lines[0])
        journal.seek(4 << 30)  # a sparse file: 4 GB of what is no event, on no disk
        journal.write("\n" + "".join(lines[1:-1]))
    shown = subprocess.run([sys.executable, "-m", "rankguard.cli", "status", "--json",
                            str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown
    view = json.loads(shown.stdout)
    assert view["run_id"] == "planted" and view["attempt"] == 0 and not view["ended"], view
    assert [r["rank"] for r in view["ranks"]] == [0, 1, 2], view
    assert shown.stderr.count("\n") == 1 and "the events between are left out" in shown.stderr


def test_rankguard_stacks_signals_no_process_that_is_not_the_runs_rank(tmp_path: Path) -> None:
    """A journal names pids: one that names a process of the user's that catches SIGUSR1 (a
    log reopen, a state dump), dated so that it passes for the rank's, does not get it."""
    got = tmp_path / "got"
    catcher = subprocess.Popen([sys.executable, "-c", (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *_: open(sys.argv[1], 'w').write('signalled'))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"), str(got)], stdout=subprocess.PIPE, text=True)
    try:
        assert catcher.stdout is not None and catcher.stdout.readline() == "ready\n"
        later = T + 10 ** 6  # its process started before the event: it passes for the rank's
        events = [{"event": "run_start", "ts": later, "run_id": "planted"},
                  {"event": "attempt_start", "ts": later, "attempt": 0},
                  {"event": "rank_start", "ts": later, "attempt": 0, "rank": 0,
                   "pid": catcher.pid}]
        (tmp_path / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        shown = subprocess.run([sys.executable, "-m", "rankguard.cli", "stacks", "--timeout",
                                "1", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                               timeout=60)
        assert shown.returncode == 1 and "1 not asked" in shown.stdout, shown
        assert catcher.poll() is None and not got.exists(), "the process was signalled"
    finally:
        catcher.kill()
        catcher.wait(10)


def test_a_link_planted_at_a_ranks_recent_operations_is_not_read_through(tmp_path: Path) -> None:
    elsewhere, attempt = tmp_path / "elsewhere", tmp_path / "run" / "attempt0"
    elsewhere.mkdir()
    attempt.mkdir(parents=True)
    recent_file.write(str(elsewhere), 0, 0, 123, [], 0.0)
    assert recent_file.read_attempt(str(elsewhere))[0].pid == 123  # a file of the format
    os.symlink(recent_file.path(str(elsewhere), 0), recent_file.path(str(attempt), 0))
    assert recent_file.read_attempt(str(attempt)) == {}


def test_a_run_whose_launcher_was_killed_is_shown_over_and_the_live_view_ends(
        tmp_path: Path) -> None:
    """No run_end will come: the live view (on a terminal) ended only at Ctrl-C, and the
    report called the run running."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)  # the launcher's pid, now of no process
    events = [{"event": "run_start", "ts": T, "run_id": "killed", "pid": gone.pid},
              {"event": "attempt_start", "ts": T, "attempt": 0},
              {"event": "rank_start", "ts": T, "attempt": 0, "rank": 0, "pid": gone.pid}]
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    leader, follower = os.openpty()  # a terminal: the view refreshes until the run is over
    try:
        live = subprocess.run([sys.executable, "-m", "rankguard.cli", "status", "--interval",
                               "0.1", str(tmp_path)], cwd=ROOT, stdout=follower,
                              stderr=subprocess.PIPE, text=True, timeout=60)
        shown = os.read(leader, 1 << 16).decode()
    finally:
        os.close(leader)
        os.close(follower)
    assert live.returncode == 0 and f"launcher (pid {gone.pid}) is gone" in shown, (live, shown)
    made = subprocess.run([sys.executable, "-m", "rankguard.cli", "report", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0 and "killed: over, its launcher" in made.stdout, made


def test_rankguard_stacks_prints_no_escape_sequence_of_a_journal_or_a_dump(
        tmp_path: Path) -> None:
    """A run id and a rank's frames (its code names them) reach the terminal without control
    characters: an escape sequence could retitle, clear or write the clipboard."""
    escape = "\x1b]0;retitled\x07\x1b[2J"
    (tmp_path / "attempt0").mkdir()
    events = [dict(e, run_id="r" + escape) for e in RUN[:3]] + [RUN[-1]]
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "attempt0" / "stacks_rank0.txt").write_text(_dump("f" + escape))
    shown = subprocess.run([sys.executable, "-m", "rankguard.cli", "stacks", "--full",
                            str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "retitled" in shown.stdout, shown
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout, shown.stdout


def test_a_report_that_cannot_be_written_in_full_is_not_left_half_written(
        tmp_path: Path) -> None:
    """A full disk (here a file size limit: the same error at write) is one line, exit 2,
    and leaves no report that looks made."""
    import resource

    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in RUN))
    made = subprocess.run(
        [sys.executable, "-m", "rankguard.cli", "report", str(tmp_path)], cwd=ROOT,
        capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000)))
    assert made.returncode == 2 and "cannot write" in made.stderr, made
    assert made.stderr.count("\n") == 1 and not (tmp_path / "report.html").exists(), made


def test_rankguard_status_reads_no_ledger_planted_in_the_shared_memory_folder(
        tmp_path: Path) -> None:
    """/dev/shm is everyone's: a folder named after the run that others can write holds a
    forged ledger (shown as the rank's before), and a FIFO at a ledger's name (status waited
    on it forever, even for a run that had ended)."""
    run_id = f"planted-{uuid.uuid4().hex[:8]}"
    shared, mine = (os.path.join(ledger.default_dir(), f"rankguard-ledgers-{run_id}-{n}")
                    for n in ("shared", "mine"))
    later = time.time() + 10 ** 6  # the ranks' pid (this process) passes for theirs
    events = [{"event": "run_start", "ts": later, "run_id": run_id},
              {"event": "attempt_start", "ts": later, "attempt": 0},
              *({"event": "rank_start", "ts": later, "attempt": 0, "rank": r, "pid": os.getpid()}
                for r in (0, 1))]
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    try:
        os.mkdir(shared)
        os.chmod(shared, 0o777)
        forged = os.path.join(shared, "attempt0-rank0.ledger")
        ledger.create(forged, world_size=2)
        ledger.LedgerWriter(forged).world().enter(ledger.OP_CODES["all_reduce"])
        os.mkdir(mine, 0o700)
        os.mkfifo(os.path.join(mine, "attempt0-rank1.ledger"))
        shown = subprocess.run([sys.executable, "-m", "rankguard.cli", "status", "--once",
                                str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                               timeout=60)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(mine, ignore_errors=True)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown
    assert "all_reduce" not in shown.stdout and shown.stdout.count("starting") == 2, shown.stdout


def test_a_journal_that_is_not_a_regular_file_is_named_as_such_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A FIFO, a folder or a link to a device at the journal's name: never read, and the error
    says what is there, rather than that no journal exists."""
    for name, plant in (("fifo", os.mkfifo), ("folder", os.mkdir),
                        ("device", lambda path: os.symlink("/dev/zero", path))):
        folder = tmp_path / name
        folder.mkdir()
        plant(folder / "journal.jsonl")
        for command in ("status", "stacks", "report", "flight-recorder"):
            assert cli.main([command, str(folder)]) == 2, (name, command)
            said = capsys.readouterr().err
            assert "is not a regular file" in said, (name, command, said)
            assert len(said.strip().splitlines()) == 1, said
