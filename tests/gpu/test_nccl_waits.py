"""What /proc shows of NCCL ranks (``python -m pytest -m gpu``): a rank asleep in Python while
its peer waits on the GPU is frozen by the hang rules' judgement of its process tree (NCCL's
own threads do not make it look busy), and the peer blocked behind the collective is seen as
it is. Two real NCCL ranks on GPU 0 (``NCCL_HOSTID`` each). Skipped without a CUDA GPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rankguard import proc_waits, proctree
from rankguard.deadline import Deadline
from rankguard.launcher.progress import Seen, judge
from tests.conftest import ROOT, script
from tests.gpu.test_nccl_jobs import ONE_GPU
from tests.runtime.ranks import free_port

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or not torch.distributed.is_nccl_available(),
    reason="needs a CUDA GPU and a torch built with NCCL")]


def test_a_rank_asleep_in_python_is_frozen_while_its_nccl_peer_waits(tmp_path: Path) -> None:
    port = str(free_port())
    procs = [subprocess.Popen(
        [sys.executable, script("nccl_sleeper.py"), str(tmp_path)], cwd=str(ROOT),
        env={**os.environ, **ONE_GPU, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
             "RANK": str(rank), "WORLD_SIZE": "2"}, start_new_session=True)
        for rank in range(2)]
    try:
        limit = Deadline.after(120.0)
        while not all((tmp_path / f"rank{r}").exists() for r in (0, 1)):
            assert not limit.passed(), "the ranks never reached their first 10 all-reduces"
            assert all(p.poll() is None for p in procs), [p.returncode for p in procs]
            time.sleep(0.1)
        time.sleep(2.0)  # rank 0 reaches its synchronize, rank 1 its sleep
        pids = [int((tmp_path / f"rank{r}").read_text()) for r in (0, 1)]
        peers = proc_waits.JobPeers(roots=())
        seen = {}
        for rank, pid in enumerate(pids):
            before = proc_waits.sample(pid, peers)
            time.sleep(1.0)
            after = proc_waits.sample(pid, peers)
            assert before is not None and after is not None
            seen[rank] = judge(before, after, 1.0)
            print(f"rank {rank}: {seen[rank]}; threads: "
                  + ", ".join(f"{t.state}/{t.call.value}/{t.what}" for t in after.threads))
        assert seen[1].seen is Seen.FROZEN, seen
    finally:
        for proc in procs:
            proctree.signal_tree(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
