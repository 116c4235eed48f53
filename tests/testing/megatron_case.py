"""The Megatron-LM case, for gloo (tests/testing) and NCCL (tests/gpu): every rank runs the suite
(``torchrun -m pytest`` or ``rankguard run -m pytest``); a session fixture forms the group and,
at teardown, calls ``barrier()`` then ``destroy_process_group()``; rank 1 fails a test while
rank 0 waits inside that test's all_reduce for it; the test after it runs on a group the plugin
formed anew."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, finish
from tests.runtime.ranks import free_port
from tests.testing.released import released_by

CONFTEST = '''
import os

import pytest
import torch
import torch.distributed as dist

BACKEND = os.environ["SUITE_BACKEND"]


def device():
    return torch.device("cuda", 0) if BACKEND == "nccl" else torch.device("cpu")


@pytest.fixture(scope="session", autouse=True)
def distributed():
    if BACKEND == "nccl":  # ranks sharing GPU 0: each a host of its own for NCCL
        os.environ.setdefault("NCCL_HOSTID", f"host{os.environ['RANK']}")
        torch.cuda.set_device(0)
    dist.init_process_group(BACKEND)
    yield
    dist.barrier()
    dist.destroy_process_group()
'''

SUITE = '''
import torch
import torch.distributed as dist

from conftest import device


def test_before():
    t = torch.ones(1, device=device())
    dist.all_reduce(t)
    assert t.item() == 2


def test_rank1_fails_while_rank0_waits_in_its_all_reduce():
    if dist.get_rank() == 1:
        assert False, "rank 1 fails before its all_reduce"
    t = torch.ones(1, device=device())
    dist.all_reduce(t)
    assert t.item() == 2  # rank 0 reads the result: it waits here on NCCL


def test_collectives_work_again_after_the_failure():
    t = torch.ones(1, device=device())
    dist.all_reduce(t)
    assert t.item() == 2
'''

RUN_S = 120.0  # each run's hard bound (a deadlocked teardown would run for the backend's 30 min)


@dataclass
class SuiteRun:
    code: int
    output: str
    wall_s: float


def write_suite(folder: Path) -> Path:
    folder.mkdir()
    (folder / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (folder / "test_suite.py").write_text(textwrap.dedent(SUITE))
    return folder


def pytest_args(suite: Path, deadline: float, backend: str) -> list[str]:
    """The ranks' pytest command line; on NCCL without output capture, so that what the C++
    runtime writes as it aborts a process reaches the output (captured, it went down with the
    process: a rank that died of SIGABRT on an H100 said nothing of why)."""
    capture = ["--capture=no"] if backend == "nccl" else []
    return ["-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:timeout", *capture,
            "--rootdir", str(suite), "--rankguard-deadline", f"{deadline:g}", str(suite)]


def under_torchrun(tmp_path: Path, backend: str, deadline: float,
                   env: dict[str, str] | None = None) -> SuiteRun:
    """``torchrun --nproc-per-node 2 -m pytest`` on the suite; its process tree is killed if
    it outlives ``RUN_S``."""
    suite = write_suite(tmp_path / "suite")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), *pytest_args(suite, deadline, backend)]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True,
                            env={**os.environ, **(env or {}), "SUITE_BACKEND": backend})
    run = finish(proc, tmp_path, RUN_S, started, what="torchrun -m pytest")
    (tmp_path / "output.log").write_text(run.stdout)  # whole, where an assertion shows its end
    return SuiteRun(run.code, run.stdout, run.wall_s)


def under_rankguard(run_rankguard: Any, tmp_path: Path, backend: str, deadline: float,
                    env: dict[str, str] | None = None) -> SuiteRun:
    """``rankguard run --nproc-per-node 2 -m pytest`` on the suite (its ranks' logs are its
    output)."""
    suite = write_suite(tmp_path / "suite")
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "60",
                         *pytest_args(suite, deadline, backend)],
                        timeout=RUN_S, env={**(env or {}), "SUITE_BACKEND": backend})
    logs = "".join(f"----- rank {rank} -----\n" + path.read_text() for rank, path in
                   enumerate(sorted((run.log_dir / "attempt0").glob("rank?.log"))))
    output = logs + run.stdout + run.stderr
    (tmp_path / "output.log").write_text(output)  # whole, where an assertion shows its end
    return SuiteRun(run.code, output, run.wall_s)


def check_bounded_and_both_reported(run: SuiteRun, deadline: float) -> None:
    """Both ranks' failures are reported, rank 0's naming rank 1, the next test passes on both
    ranks, all within about one test deadline each (the teardown's barrier included), and the
    run failed."""
    text = run.output
    assert "AssertionError: rank 1 fails before its all_reduce" in text, text[-6000:]
    # rank 0 is released from its all_reduce by rank 1's notice (or, if the notice came first,
    # refused as it starts it, or, when rank 1 was already in the next test, skips this one),
    # naming rank 1's failed test
    assert released_by(text, r"rank 1 failed test_suite\.py::test_rank1_fails_while_rank0_waits_"
                             r"in_its_all_reduce"), text[-6000:]
    # the plugin formed the group anew before the next test, on both ranks
    assert len(re.findall(r"^PASSED \S*test_suite\.py::test_collectives_work_again_after_the_"
                          r"failure$", text, re.M)) == 2, text[-6000:]
    assert run.code != 0
    assert run.wall_s < 3 * deadline + 30, f"took {run.wall_s:.1f} s"  # not the backend's
