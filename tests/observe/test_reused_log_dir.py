"""A log folder given to a later run again (``--log-dir logs`` each time, a script resuming from
its checkpoints there) holds both runs' events in one journal and the earlier run's files in
its ``attemptN``: the commands show the latest run, the one that may be running, and none of
the earlier run's files as its."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from rankguard import cli

from ..conftest import script
from .test_commands import WAIT_S, command, job, launch, finish

T = 1_800_000_000.0  # a wall-clock time, of the earlier run


def _earlier_run(folder: Path) -> list[dict]:
    """A run that ended, with its rank 0's recent operations kept in attempt0."""
    (folder / "attempt0").mkdir(parents=True)
    (folder / "attempt0" / "recent_rank0.json").write_text(json.dumps(
        {"format": 1, "rank": 0, "attempt": 0, "pid": 10, "earlier": False,
         "ops": [{"n": 1, "op": "all_reduce", "seq": 1, "world": True, "group": "ab",
                  "members": [0], "t_enter": T + 1, "t_done": T + 2}]}))
    return [{"event": "run_start", "ts": T, "run_id": "earlier", "pid": 9},
            {"event": "attempt_start", "ts": T, "run_id": "earlier", "attempt": 0},
            {"event": "rank_start", "ts": T, "run_id": "earlier", "attempt": 0, "rank": 0,
             "pid": 10},
            {"event": "rank_exit", "ts": T + 3, "run_id": "earlier", "attempt": 0, "rank": 0,
             "outcome": "ok"},
            {"event": "attempt_end", "ts": T + 3, "run_id": "earlier", "attempt": 0},
            {"event": "run_end", "ts": T + 3, "run_id": "earlier", "status": "succeeded",
             "exit_code": 0}]


def test_a_journal_of_two_runs_is_shown_as_its_latest_run_without_the_earlier_runs_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "logs"
    live = subprocess.Popen(["sleep", "60"])  # the later run's launcher and rank, alive
    try:
        now = time.time()
        later = [{"event": "run_start", "ts": now, "run_id": "later", "pid": live.pid},
                 {"event": "attempt_start", "ts": now, "run_id": "later", "attempt": 0},
                 {"event": "rank_start", "ts": now, "run_id": "later", "attempt": 0,
                  "rank": 0, "pid": live.pid}]
        events = _earlier_run(folder) + later
        (folder / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        assert cli.main(["status", "--json", str(folder)]) == 0
        view = json.loads(capsys.readouterr().out)
        assert (view["run_id"], view["ended"]) == ("later", False), view
        assert [(r["pid"], r["state"]) for r in view["ranks"]] == [(live.pid, "starting")]
        assert cli.main(["report", str(folder)]) == 0
        assert "run later: running" in capsys.readouterr().out
        assert "all_reduce #1" not in (folder / "report.html").read_text()  # the earlier one's
        assert cli.main(["flight-recorder", str(folder)]) == 1  # none kept of the later run
        assert "run later, attempt 0: no rank's recent operations" in capsys.readouterr().err
    finally:
        live.kill()
        live.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.deadline(240)
def test_a_run_in_the_log_folder_of_an_ended_run_is_the_one_status_and_stacks_show(
        tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    started = time.monotonic()
    first = finish(launch(["--run-id", "first", script("allreduce.py"), "3"], log_dir), log_dir,
                   120, started)
    assert first.code == 0, first.stderr[-2000:]
    with job(["--run-id", "second", script("sleeper.py")], log_dir) as proc:
        deadline = time.monotonic() + WAIT_S
        while True:  # until the second run's rank is up and answers
            shown = command("stacks", str(log_dir))
            if "now, 1 of 1 live rank(s) answered" in shown.stdout:
                break
            assert proc.poll() is None, proc.communicate(timeout=10)[1][-3000:]
            assert time.monotonic() < deadline, shown.stdout + shown.stderr
            time.sleep(0.5)
        assert shown.stdout.startswith("run second, attempt 0"), shown.stdout
        view = json.loads(command("status", "--json", str(log_dir)).stdout)
        assert (view["run_id"], view["ended"]) == ("second", False), view
        assert view["ranks"][0]["process"] != "gone", view
