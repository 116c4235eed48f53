"""``rankguard serve`` refuses bad input before anything starts: one line naming what is wrong,
exit code 2, no traceback, no process left."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT

NOT_A_SERVICE = "app = 42\n"
BROKEN = "import nonexistent_module_xyz\n"
# a validate the ranks (which run it) cannot get
LAMBDA = ("import rankguard\ndef handle(state, request):\n    return 1\n"
          "app = rankguard.Service(handle=handle, validate=lambda request: request)\n")


@pytest.mark.parametrize("args, expected", [
    (["examples/serve_tp.py:app", "--port", "http"], "--port: 'http' is not an integer"),
    (["examples/serve_tp.py:app", "--grace", "-1"], "--grace: '-1' is below 0.1"),
    (["examples/serve_tp.py:app", "--spares", "two"], "--spares: 'two' is not an integer"),
    (["examples/serve_tp.py:app", "--world-size", "0"], "--world-size: '0' is below 1"),
    (["examples/serve_tp.py:app", "--on-healing", "pray"], "invalid choice: 'pray'"),
    (["examples/nowhere.py:app"], "APP: no such file: examples/nowhere.py"),
    (["examples/serve_tp.py:model"], "APP: examples/serve_tp.py has no attribute 'model'"),
    (["no_such_module_abc:app"], "APP: cannot import module 'no_such_module_abc'"),
    (["{tmp}/not_a_service.py"], "not_a_service.py:app is a int, not a rankguard.Service"),
    (["{tmp}/broken.py:app"], "ModuleNotFoundError: No module named 'nonexistent_module_xyz'"),
    (["{tmp}/lambda_app.py"], "lambda_app.py:app's validate cannot be sent to the ranks: "),
    # named after a module Python has (or finds) already: the ranks would take it for the file
    (["{tmp}/queue.py"], "queue.py has the name of the module 'queue' that Python imports from "),
    (["{tmp}/calendar.py"], "(rename calendar.py, e.g. my_calendar.py)"),
    ([], "the following arguments are required: APP"),
    (["examples/serve_tp.py:app", "--port", "99999"], "--port: '99999' is above 65535"),
    # an empty host listened on every interface
    (["examples/serve_tp.py:app", "--host", ""], "--host: it is empty (give an address to "
     "listen on: 127.0.0.1 (this machine only), or 0.0.0.0 for every interface)"),
    (["examples/serve_tp.py:app", "--host", "256.1.1.1"],
     "(give an address of this machine, e.g. --host 127.0.0.1)"),
    (["examples/serve_tp.py:app", "--max-queue", "1000000000000"],
     "--max-queue: '1000000000000' is above 10000"),
    (["examples/serve_tp.py:app", "--journal", "{tmp}"], "is a folder"),
    (["examples/serve_tp.py:app", "--max-body", "0"], "--max-body: '0' is below 1"),
    (["examples/serve_tp.py:app", "--max-connections", "0"], "--max-connections: '0' is below 1"),
    (["examples/serve_tp.py:app", "--max-connections", "many"],
     "--max-connections: 'many' is not an integer"),
    (["examples/serve_tp.py:app", "--max-body", "1MB"], "--max-body: '1MB' is not an integer"),
    (["examples/serve_tp.py:app", "--max-inflight-bytes", "64MB"],
     "--max-inflight-bytes: '64MB' is not an integer"),
    (["examples/serve_tp.py:app", "--max-body", "2000", "--max-inflight-bytes", "1999"],
     "--max-inflight-bytes: 1999 bytes is less than --max-body (2000): a body of the largest "
     "size would never fit (give at least 2000"),
    (["examples/serve_tp.py:app", "--spares", "1" + "0" * 20], "--spares: 1000000000000000"),
    (["examples/serve_tp.py:app", "--world-size", "600", "--spares", "1"],
     "more than 1024 rank processes"),
    (["examples/serve_tp.py:app", "--devices", "a,b"], "--devices: 'a' is not a CUDA device index"),
    pytest.param(["examples/serve_tp.py:app", "--devices", "0,1,2"],
                 "--devices: 3 device(s) [0, 1, 2] for 2 rank(s) per replica (give one CUDA "
                 "device index per rank, e.g. 0,1, or one such list per replica, spares "
                 "included, e.g. 0,1/2,3)", marks=pytest.mark.slow),  # 3 s: out of the quick run
    # out of range where GPUs are visible, none visible elsewhere: both name the device
    (["examples/serve_tp.py:app", "--devices", "1000,1000"], "--devices: device 1000 "),
    pytest.param(["examples/serve_tp.py:app", "--devices", "0,1", "--gpus-per-replica", "1"],
                 "--devices and --gpus-per-replica: both were given",
                 marks=pytest.mark.slow),  # 3 s: out of the quick run
    (["examples/serve_tp.py:app", "--gpus-per-replica", "0"], "--gpus-per-replica: '0' is below 1"),
    (["examples/serve_tp.py:app", "--warm-spares", "-1"], "--warm-spares: '-1' is below 0"),
    (["examples/serve_tp.py:app", "--warm-spares", "one"], "--warm-spares: 'one' is not"),
    (["examples/serve_tp.py:app", "--warm-spares", "100000"], "--warm-spares: '100000' is above"),
    (["examples/serve_tp.py:app", "--gpus-per-replica", "2", "--replicas", "300"],
     "--gpus-per-replica: 2 per replica x 301 replicas"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], expected: str,
                                          tmp_path: Path) -> None:
    (tmp_path / "not_a_service.py").write_text(NOT_A_SERVICE)
    (tmp_path / "broken.py").write_text(BROKEN)
    (tmp_path / "lambda_app.py").write_text(LAMBDA)
    for shadow in ("queue.py", "calendar.py"):
        (tmp_path / shadow).write_text(Path(ROOT, "examples", "serve_tp.py").read_text())
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = subprocess.run([sys.executable, "-m", "rankguard.cli", "serve", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert expected in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("rankguard serve: error: ")
    assert "listening" not in done.stdout  # nothing started


def test_a_port_in_use_is_refused_with_the_port_named(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "rankguard.cli", "serve",
                               "examples/serve_tp.py:app", "--port", str(port)], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"--host/--port: cannot listen on 127.0.0.1:{port}" in done.stderr


def test_max_connections_that_could_take_the_pools_descriptors_is_refused() -> None:
    """Under an open-file limit of 256, --max-connections 1000 was taken: clients then held
    every descriptor, each accept failed with EMFILE (tens of thousands of traceback lines in
    seconds) and the pool's replicas could not start."""
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(
            resource.RLIMIT_NOFILE)[1]))

    done = subprocess.run([sys.executable, "-m", "rankguard.cli", "serve",
                           "examples/serve_tp.py:app", "--max-connections", "1000"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, preexec_fn=low_limit)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "rankguard serve: error: --max-connections: 1000 connections, with the sockets accepted "
        "ahead of them, could take more than half of the 256 descriptors this process may "
        "open, which the pool's ranks need (give at most 64, or raise the open-file limit "
        "with ulimit -n)")


def test_the_default_max_connections_is_within_the_most_allowed() -> None:
    from rankguard.serving import head_deadline

    most = head_deadline.most_connections()
    assert head_deadline.default_max_connections() <= most
    assert most + 2 * head_deadline.accept_batch(most) <= head_deadline.open_file_limit() // 2
