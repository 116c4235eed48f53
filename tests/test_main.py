"""``python -m rankguard`` is the ``rankguard`` command."""

import subprocess
import sys

from rankguard.records import journal
from tests.conftest import ROOT, script


def _python_m(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "rankguard", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=str(ROOT))


def test_python_m_rankguard_help_lists_the_commands():
    proc = _python_m("--help")
    assert proc.returncode == 0, proc.stderr
    assert "rankguard run [options] SCRIPT" in proc.stdout
    assert "serve" in proc.stdout


def test_python_m_rankguard_run_launches_the_job(tmp_path):
    proc = _python_m("run", "--master-port", "0", "--log-dir", str(tmp_path), "--nproc-per-node",
                     "2", script("sleeper.py"), "0")
    assert proc.returncode == 0, proc.stderr
    events = list(journal.read(str(tmp_path / "journal.jsonl")))
    end = [e for e in events if e["event"] == "run_end"]
    assert end and end[0]["status"] == "succeeded"
    assert {e["rank"] for e in events if e["event"] == "rank_exit"} == {0, 1}


def test_python_m_rankguard_without_a_command_exits_2():
    proc = _python_m()
    assert proc.returncode == 2 and "usage: rankguard run" in proc.stderr
