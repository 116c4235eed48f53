"""Bad input: one line naming the problem and the fix, exit code 2, nothing started."""

import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT, script


def _run(args, tmp_path, env=None):
    log_dir = tmp_path / "logs"
    proc = subprocess.run([sys.executable, "-m", "rankguard.cli", "run", "--log-dir",
                           str(log_dir), *args], capture_output=True, text=True, timeout=60,
                          cwd=str(ROOT), env={**os.environ, **(env or {})})
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
    (["--nnodes", "2", "--master-port", "0", "x.py"],
     "--master-port: 0 (or --standalone) cannot be found by the other nodes"),
    (["--nnodes", "1:2", "x.py"], "--rdzv-backend static needs a fixed number of nodes"),
    (["--nnodes", "2", "--node-rank", "2", "x.py"], "--node-rank: 2 is not below --nnodes 2"),
    (["--node-rank", "1", "x.py"], "--node-rank: 1 is only for several nodes"),
    (["--node-rank", "-1", "x.py"], "--node-rank: '-1' is below 0"),
    (["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--rdzv-id", "j",
      "--node-rank", "1", "x.py"], "--node-rank: 1 is only for several nodes with --rdzv-backend "
     "static"),
    (["--nnodes", "2", "--rdzv-conf", "is_host=1", "x.py"],
     "unknown key 'is_host' for --rdzv-backend static"),
    (["--inject", "boom:rank=0,at=op1", "x.py"], "unknown kind 'boom'"),
    (["--recovery", "sideways", "x.py"], "--recovery: 'sideways' is not a recovery mode (give "
     "restart or in-place)"),
    (["--recovery", "in-place", "x.py"], "in-place needs --max-restarts of at least 1"),
    (["--bogus-flag", "x.py"], "unrecognized arguments: --bogus-flag"),
    (["missing_script.py"], "'missing_script.py' does not exist"),
    (["-m", "no_such_module_here"], "no module named 'no_such_module_here'"),
    ([], "the following arguments are required: SCRIPT"),
    # numbers: only plain decimal spellings, finite, within what the timers can wait
    (["--nproc-per-node", "1_0", "x.py"], "--nproc-per-node: '1_0' is not an integer"),
    (["--nproc-per-node", "١٢", "x.py"], "--nproc-per-node: '١٢' is not an integer"),
    (["--master-port", "2_9500", "x.py"], "--master-port: '2_9500' is not an integer"),
    (["--max-restarts", " 1", "x.py"], "--max-restarts: ' 1' is not an integer"),
    (["--hang-timeout", "1_0", "x.py"], "--hang-timeout: '1_0' is not a number"),
    (["--grace", "inf", "x.py"], "--grace: 'inf' is not a finite number"),
    (["--straggler-timeout", "1e999", "x.py"], "--straggler-timeout: '1e999' is not a finite"),
    (["--grace", "1e300", "x.py"], "--grace: '1e300' is above 1000000000"),
    (["--collective-timeout", "1e12", "x.py"], "--collective-timeout: '1e12' is above"),
    # fault specs: the same checks for their numbers, and no part given twice or never used
    (["--inject", "crash:nan:rank=0,at=op1", "x.py"], "exit code 'nan' is not a finite number"),
    (["--inject", "crash:inf:rank=0,at=op1", "x.py"], "exit code 'inf' is not a finite number"),
    (["--inject", "crash:1.5:rank=0,at=op1", "x.py"], "exit code '1.5' is not an integer"),
    (["--inject", "slow:nan:rank=0,at=op1", "x.py"], "seconds 'nan' is not a finite number"),
    (["--inject", "gil:inf:rank=0,at=op1", "x.py"], "seconds 'inf' is not a finite number"),
    (["--inject", "slow:1_0:rank=0,at=op1", "x.py"], "seconds '1_0' is not a number"),
    (["--inject", "hang:rank=0,at=99999999999s", "x.py"], "time '99999999999' is above"),
    (["--inject", "hang:rank=²,at=op1", "x.py"], "rank='²' is not a rank number"),
    (["--inject", "hang:rank=0,rank=1,at=op1", "x.py"], "option rank= is given twice"),
    (["--inject", "hang:rank=0,at=op1,attempt=1", "x.py"], "targets attempt 1, but the run "
     "has attempts 0 to 0"),
    # each fault has a byte in the ledger, to tell the run which never fired
    (["--inject", "hang:rank=0,at=op1"] * 65 + ["x.py"], "--inject: is given 65 times, more "
     "than the 64 a run may have (give fewer faults)"),
    # run ids name files and folders
    (["--run-id", "..", "x.py"], "--run-id: '..' is not a simple name"),
    (["--run-id", "a/b", "x.py"], "--run-id: 'a/b' is not a simple name"),
    (["--run-id=-rf", "x.py"], "--run-id: '-rf' is not a simple name"),
    (["--run-id=", "x.py"], "--run-id: '' is not a simple name"),
    # modules python -m could not run
    (["-m", "json"], "'json' is a package without a __main__ module"),
    (["-m", "sleeper.py"], "give the module's name without .py"),
    (["-m", "a..b"], "'a..b' is not a module name"),
    # torchrun's flags: torchrun's values only
    (["--redirects", "4", "x.py"], "--redirects: '4' is neither 0-3 nor LOCAL_RANK:0-3,..."),
    (["-t", "0:1,x", "x.py"], "--tee: '0:1,x' is neither 0-3 nor LOCAL_RANK:0-3,..."),
    (["--local-ranks-filter", "0,a", "x.py"], "--local-ranks-filter: '0,a' is not a "
     "comma-separated list of local ranks"),
    (["--monitor-interval", "soon", "x.py"], "--monitor-interval: 'soon' is not a number"),
    (["--start_method", "thread", "x.py"], "--start-method/--start_method: invalid choice: "
     "'thread'"),
    (["--numa-binding", "gpu", "x.py"], "--numa-binding/--numa_binding: invalid choice: 'gpu'"),
    (["--signals-to-handle", "SIGFOO", "x.py"], "--signals-to-handle: 'SIGFOO' is not a "
     "signal name"),
    (["--signals-to-handle", "SIGTERM,SIGKILL", "x.py"], "--signals-to-handle: SIGKILL cannot "
     "be caught"),
    (["--signals-to-handle", "SIGTERM,SIGCHLD", "x.py"], "--signals-to-handle: SIGCHLD comes to "
     "a healthy launcher each time a rank exits"),
    (["--rdzv-backend", "zzz", "x.py"], "--rdzv-backend: unknown backend 'zzz'"),
    (["--no-python", "-m", "json.tool"], "--no-python: runs SCRIPT as an executable, and -m "
     "runs a Python module: they cannot go together"),
    (["--no-python", "x.py"], "is not executable (--no-python runs it as a program)"),
    (["--no-python", "no_such_program_here"], "'no_such_program_here' is no executable on "
     "PATH"),
    (["--grace", "1", "--shutdown-timeout", "2", "x.py"], "--shutdown-timeout: is torchrun's "
     "name of --grace, and both are given"),
    (["--shutdown_timeout", "-1", "x.py"], "--shutdown-timeout: '-1' is below 0"),
    (["--no-tee", "--redirects", "1", "x.py"], "--no-tee: is --redirects 3, and --redirects "
     "is given too"),
    (["--role", " ", "x.py"], "--role: is empty"),
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
    assert not log_dir.exists()


@pytest.mark.parametrize("secret, fragment", [
    ("zz", "got 2 characters, not all hex digits"),
    ("ab" * 8, "got 16 characters ("),
    ("ab" * 32 + " ", "got 65 characters, not all hex digits"),
])
def test_a_secret_that_is_short_or_not_hex_gives_one_line_and_exit_2(tmp_path, secret,
                                                                       fragment):
    proc, log_dir = _run([script("sleeper.py")], tmp_path, {"RANKGUARD_SECRET": secret})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rankguard run: error: RANKGUARD_SECRET: "
                                                   "expected at least 32 hex digits"), lines
    assert fragment in lines[0] and "openssl rand -hex 32" in lines[0]
    assert not log_dir.exists()


def _journal_refused(tmp_path, journal, fragment):
    proc, log_dir = _run(["--journal", str(journal), script("sleeper.py")], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rankguard run: error: --journal:"), lines
    assert fragment in lines[0]
    assert not log_dir.exists()  # nothing was started, and the log folder made is gone again


def test_journal_naming_a_folder_is_refused(tmp_path):
    _journal_refused(tmp_path, tmp_path, "is a folder (give a file path")


def test_journal_naming_a_fifo_nobody_reads_is_refused_instead_of_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    _journal_refused(tmp_path, tmp_path / "fifo", "is a FIFO that nobody reads")


@pytest.mark.parametrize("journal, fragment", [("/dev/full", "is not a regular file"),
                                               ("/proc/version", "cannot be appended to")])
def test_journal_that_is_not_a_file_one_can_append_to_is_refused(tmp_path, journal, fragment):
    _journal_refused(tmp_path, journal, fragment)


def test_journal_that_is_a_symbolic_link_is_refused_and_its_target_left_alone(tmp_path):
    target = tmp_path / "someone_elses_file"
    target.write_text("keep\n")
    (tmp_path / "link.jsonl").symlink_to(target)
    _journal_refused(tmp_path, tmp_path / "link.jsonl", "is a symbolic link (not followed")
    assert target.read_text() == "keep\n"


def test_journal_that_cannot_be_created_is_refused_and_leaves_nothing(tmp_path):
    _journal_refused(tmp_path, tmp_path / ("j" * 300), "File name too long")
    assert list(tmp_path.iterdir()) == []


def test_run_id_dot_dot_does_not_put_the_logs_in_the_parent_folder(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rankguard.cli", "run", "--run-id", "..",
                           script("sleeper.py"), "0"], capture_output=True, text=True,
                          timeout=60, cwd=str(ROOT), env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_inject_on_a_rank_that_does_not_exist_is_refused(tmp_path):
    proc, _ = _run(["--nproc-per-node", "2", "--inject", "kill:rank=5,at=op1",
                    script("sleeper.py")], tmp_path)
    assert proc.returncode == 2
    assert "targets rank 5, but the run has ranks 0 to 1" in proc.stderr


@pytest.mark.parametrize("log_dir_existed", [False, True], ids=["made", "given"])
def test_port_in_use_is_reported_and_nothing_starts_nor_is_left(tmp_path, log_dir_existed):
    """A run that started nothing leaves no folder it made for its logs (``logs/`` included, above
    the one it was given), and keeps the one it was given if that existed already."""
    log_dir = tmp_path / "logs" / "run"
    if log_dir_existed:
        log_dir.mkdir(parents=True)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc, _ = _run(["--log-dir", str(log_dir), "--master-port", str(port),
                        script("sleeper.py")], tmp_path)
    assert proc.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use" in proc.stderr
    assert "--master-port 0" in proc.stderr
    assert log_dir.is_dir() if log_dir_existed else list(tmp_path.iterdir()) == []
    assert not (log_dir / "journal.jsonl").exists()


def test_unknown_command_exits_2():
    proc = subprocess.run([sys.executable, "-m", "rankguard.cli", "launch"], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and "unknown command 'launch'" in proc.stderr


def test_virtual_local_rank_with_fewer_visible_devices_than_ranks_is_refused(tmp_path):
    proc, log_dir = _run(["--virtual-local-rank", "--nproc-per-node", "2",
                          script("sleeper.py")], tmp_path, {"CUDA_VISIBLE_DEVICES": "3"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "rankguard run: error: --virtual-local-rank: 2 local ranks, but CUDA_VISIBLE_DEVICES=3 "
        "names fewer devices (lower --nproc-per-node, or name more devices)"]
    assert not (log_dir / "journal.jsonl").exists()


def test_a_torchrun_switch_from_the_environment_that_is_not_an_integer_is_refused(tmp_path):
    proc, log_dir = _run([script("sleeper.py")], tmp_path, {"PET_STANDALONE": "yes"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "rankguard run: error: PET_STANDALONE: 'yes' is not an integer (set it to 1 (as "
        "--standalone) or 0)"]
    assert not (log_dir / "journal.jsonl").exists()
