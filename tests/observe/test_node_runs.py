"""A run of several nodes keeps each agent's log folder in ``RUN_ID/HOST-PID/``: its RUN_ID
names the one agent that ran on this machine; where several did, the error names each
(``RUN_ID/HOST-PID``), and each of those is taken. Real agents on 127.0.0.1, their default log
folders under a private ``$TMPDIR``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, finish, script
from tests.launcher.test_multinode import JOIN_S, _free_port, _kill_all

OBSERVE = ("status", "stacks", "report", "flight-recorder")


def _command(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rankguard.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def _two_agents(tmp_path: Path, env: dict[str, str], run_id: str) -> list[Path]:
    """Run two static agents of ``run_id`` (one rank each) to the end, in their default log
    folders; returns those folders."""
    port = _free_port()
    common = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
              "--rdzv-id", run_id, "--rdzv-conf", f"join_timeout={JOIN_S}", "--grace", "2"]
    procs = [(subprocess.Popen([sys.executable, "-m", "rankguard.cli", "run", *common,
                                "--node-rank", str(node), script("node_env.py"), "3"],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True),
              tmp_path) for node in (1, 0)]
    started = time.monotonic()
    try:
        runs = [finish(proc, log_dir, 120, started) for proc, log_dir in procs]
    finally:
        _kill_all(procs)
    assert [run.code for run in runs] == [0, 0], [run.stderr[-2000:] for run in runs]
    user_dir = Path(env["TMPDIR"]) / f"rankguard-{os.geteuid()}"
    return sorted((user_dir / run_id).iterdir())


@pytest.mark.slow  # two agents meet, run, and leave: about 10 s
@pytest.mark.deadline(240)
def test_a_run_id_of_several_nodes_names_each_node_and_of_one_node_is_taken(tmp_path):
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    env.pop("RANKGUARD_SECRET", None)
    nodes = _two_agents(tmp_path, env, "mnjob")
    assert len(nodes) == 2 and all((node / "journal.jsonl").is_file() for node in nodes)
    names = [f"mnjob/{node.name}" for node in nodes]
    for command in OBSERVE:
        refused = _command(env, command, "mnjob")
        assert refused.returncode == 2, refused.stderr
        line, = refused.stderr.strip().splitlines()
        assert "'mnjob' is a run of several nodes, 2 of whose agents ran on this machine" in line
        assert all(name in line for name in names) and "'mnjob'" not in line.split("give")[1]
    for name in names:  # each node by RUN_ID/HOST-PID
        view = json.loads(_command(env, "status", "--json", name).stdout)
        assert view["ended"] and len(view["ranks"]) == 1, view
    shutil.rmtree(nodes[0])  # one agent of the run on this machine: its RUN_ID is enough
    taken = {command: _command(env, command, *extra, "mnjob") for command, extra in (
        ("status", ["--json"]), ("stacks", []),
        ("report", ["-o", str(tmp_path / "r.html")]),
        ("flight-recorder", ["-o", str(tmp_path / "fr")]))}
    for command, done in taken.items():  # stacks: 1, no rank of an ended run left stacks
        assert done.returncode == (1 if command == "stacks" else 0), (command, done.stderr)
    assert taken["stacks"].stdout.startswith("run mnjob, attempt 0: the run has ended")
    view = json.loads(taken["status"].stdout)
    assert view["run_id"] == "mnjob" and view["ended"] and len(view["ranks"]) == 1, view
    pids = {e["pid"] for e in map(json.loads, (nodes[1] / "journal.jsonl").read_text()
                                  .splitlines()) if e["event"] == "rank_start"}
    assert {r["pid"] for r in view["ranks"]} == pids  # the remaining node's rank
    assert (tmp_path / "r.html").is_file()
    # no RUN_ID given: the latest run is found inside a node's folder too
    latest = json.loads(_command(env, "status", "--json").stdout)
    assert (latest["run_id"], latest["ranks"]) == ("mnjob", view["ranks"])


def test_a_run_that_is_nowhere_is_refused_naming_the_runs_there_are(tmp_path):
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    user_dir = tmp_path / "tmp" / f"rankguard-{os.geteuid()}"
    (user_dir / "other-run").mkdir(parents=True, mode=0o700)
    user_dir.chmod(0o700)
    (user_dir / "other-run" / "journal.jsonl").write_text(
        '{"event": "run_start", "run_id": "other-run", "ts": 1.0}\n')
    refused = _command(env, "status", "no-such-run")
    assert refused.returncode == 2
    line, = refused.stderr.strip().splitlines()
    assert line == (f"rankguard status: error: RUN: no run's journal at 'no-such-run' (the "
                    f"latest runs under {user_dir}: other-run; or give a run's --log-dir or its "
                    "journal file)")
