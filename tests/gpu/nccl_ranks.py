"""Real NCCL ranks for the GPU set: several ranks on GPU 0 (each a host of its own through the
``NCCL_HOSTID`` its script sets), started with torchrun's environment, waited for under a
deadline, judged from /proc as the launcher judges a quiet rank, and killed whatever happens."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import torch

from rankguard.processes import proc_waits, proctree
from rankguard.deadline import Deadline
from rankguard.launcher.progress import POLL_S, Evidence, judge
from tests.conftest import ROOT, script
from tests.runtime.ranks import free_port

# the GPU set's marks: ``-m gpu`` selects it, and it skips where there is no GPU (CI)
GPU_SET = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or not torch.distributed.is_nccl_available(),
    reason="needs a CUDA GPU and a torch built with NCCL")]

# several ranks on one GPU: NCCL's socket transport on loopback only
ONE_GPU = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1",
           "NCCL_NVLS_ENABLE": "0", "NCCL_COLLNET_ENABLE": "0", "NCCL_SOCKET_IFNAME": "lo"}


@contextlib.contextmanager
def two_ranks(name: str, args: list[str], env: dict[str, str] | None = None
              ) -> Iterator[list[subprocess.Popen]]:
    """Ranks 0 and 1 of ``tests/scripts/NAME ARGS...``; their process trees are killed on the
    way out."""
    port = str(free_port())
    procs = [subprocess.Popen(
        [sys.executable, script(name), *args], cwd=str(ROOT),
        env={**os.environ, **ONE_GPU, **(env or {}), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": port, "RANK": str(rank), "WORLD_SIZE": "2"},
        start_new_session=True) for rank in range(2)]
    try:
        yield procs
    finally:
        for proc in procs:
            proctree.signal_tree(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def await_files(paths: list[Path], procs: list[subprocess.Popen], what: str) -> None:
    """Wait (up to 120 s: cold CUDA and NCCL starts) until every path exists, the ranks alive."""
    limit = Deadline.after(120.0)
    while not all(path.exists() for path in paths):
        assert not limit.passed(), f"the ranks never reached {what}"
        assert all(p.poll() is None for p in procs), [p.returncode for p in procs]
        time.sleep(0.1)


def judged(pid: int, interval: float, poll_s: float = POLL_S
           ) -> tuple[Evidence, proc_waits.TreeSample]:
    """What the hang rules make of process ``pid`` over ``interval`` seconds, and the sample."""
    peers = proc_waits.JobPeers(roots=())
    before = proc_waits.sample(pid, peers)
    time.sleep(interval)
    after = proc_waits.sample(pid, peers)
    assert before is not None and after is not None, f"process {pid} is gone"
    return judge(before, after, interval, poll_s), after
