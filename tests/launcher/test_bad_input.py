"""Bad input: one line naming the problem and the fix, exit code 2, nothing started."""

import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT, script


def _run(args, tmp_path):
    log_dir = tmp_path / "logs"
    proc = subprocess.run([sys.executable, "-m", "rankguard.cli", "run", "--log-dir",
                           str(log_dir), *args], capture_output=True, text=True, timeout=60,
                          cwd=str(ROOT))
    return proc, log_dir


@pytest.mark.parametrize("args, fragment", [
    (["--nproc-per-node", "0", "x.py"], "--nproc-per-node: '0' is below 1"),
    (["--nproc-per-node", "four", "x.py"], "--nproc-per-node: 'four' is not an integer"),
    (["--hang-timeout", "nan", "x.py"], "--hang-timeout: 'nan' is not a finite number"),
    (["--hang-timeout", "20", "--straggler-timeout", "5", "x.py"], "shorter than --hang-timeout"),
    (["--grace", "-1", "x.py"], "--grace: '-1' is below 0"),
    (["--collective-timeout", "soon", "x.py"], "--collective-timeout: 'soon' is not a number"),
    (["--collective-timeout", "0", "x.py"], "--collective-timeout: '0' is below 0.001"),
    (["--master-port", "70000", "x.py"], "above 65535"),
    (["--max-restarts", "1.5", "x.py"], "--max-restarts: '1.5' is not an integer"),
    (["--nnodes", "2", "x.py"], "only single-node runs"),
    (["--inject", "boom:rank=0,at=op1", "x.py"], "unknown kind 'boom'"),
    (["--bogus-flag", "x.py"], "unrecognized arguments: --bogus-flag"),
    (["missing_script.py"], "'missing_script.py' does not exist"),
    (["-m", "no_such_module_here"], "no module named 'no_such_module_here'"),
    ([], "the following arguments are required: SCRIPT"),
])
def test_bad_flag_or_value_gives_one_line_and_exit_2(tmp_path, args, fragment):
    if args and args[-1] == "x.py":
        args = [*args[:-1], script("sleeper.py")]
    proc, log_dir = _run(args, tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("rankguard run: error:") and fragment in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (log_dir / "journal.jsonl").exists()


def test_inject_on_a_rank_that_does_not_exist_is_refused(tmp_path):
    proc, _ = _run(["--nproc-per-node", "2", "--inject", "kill:rank=5,at=op1",
                    script("sleeper.py")], tmp_path)
    assert proc.returncode == 2
    assert "targets rank 5, but the run has ranks 0 to 1" in proc.stderr


def test_port_in_use_is_reported_and_nothing_starts(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc, log_dir = _run(["--master-port", str(port), script("sleeper.py")], tmp_path)
    assert proc.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use" in proc.stderr
    assert "--master-port 0" in proc.stderr
    assert not (log_dir / "journal.jsonl").exists()


def test_unknown_command_exits_2():
    proc = subprocess.run([sys.executable, "-m", "rankguard.cli", "launch"], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and "unknown command 'launch'" in proc.stderr
