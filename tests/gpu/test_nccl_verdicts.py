"""The hang rules for asynchronous groups over real NCCL progress (``python -m pytest -m gpu``):
two NCCL ranks on GPU 0 keep their Flight Recorder counts in files; the test builds each
rank's snapshot from them, judges the ranks' processes from /proc, and the rules name rank 1
and the all-reduce it held up, for a rank asleep in Python (it never enqueued it) and for a
rank whose GPU is stuck in a kernel (it enqueued it, its GPU never started it). This is what
the launcher will do once NCCL groups reach the ledger. Skipped without a CUDA GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rankguard import ledger as L
from rankguard import proc_waits, proctree
from rankguard.deadline import Deadline
from rankguard.launcher.monitor import Activity, HangRules
from rankguard.launcher.progress import Seen, judge
from tests.conftest import ROOT, script
from tests.gpu.test_nccl_jobs import ONE_GPU
from tests.launcher.snapshots import ledger
from tests.runtime.ranks import free_port

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or not torch.distributed.is_nccl_available(),
    reason="needs a CUDA GPU and a torch built with NCCL")]

HANG = 3.0


def _snapshot(record: dict) -> L.RankProgress:
    group = L.GroupProgress(L.group_key("world"), 0b11, True, 2, record["enqueued"],
                            record["completed"], "all_reduce", record["t_enqueued"],
                            record["t_completed"], record["started"], True)
    return ledger(group)


@pytest.mark.parametrize("scenario, reason", [("sleep", "no_progress"),
                                              ("gpu_stuck", "never_started")])
def test_the_rank_that_held_up_an_nccl_all_reduce_is_named_from_real_progress(
        tmp_path: Path, scenario: str, reason: str) -> None:
    port = str(free_port())
    procs = [subprocess.Popen(
        [sys.executable, script("nccl_fr_sampler.py"), scenario, str(tmp_path)], cwd=str(ROOT),
        env={**os.environ, **ONE_GPU, "TORCH_NCCL_ENABLE_TIMING": "1", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": port, "RANK": str(rank), "WORLD_SIZE": "2"}, start_new_session=True)
        for rank in range(2)]
    try:
        limit = Deadline.after(120.0)
        while not all((tmp_path / f"rank{r}.json").exists() for r in (0, 1)):
            assert not limit.passed(), "the ranks never reached their fault"
            assert all(p.poll() is None for p in procs), [p.returncode for p in procs]
            time.sleep(0.1)
        time.sleep(HANG + 1.0)  # the others wait a whole hang timeout
        records = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
        activity = {}
        for rank, record in records.items():
            before = proc_waits.sample(record["pid"], proc_waits.JobPeers(roots=()))
            time.sleep(0.5)
            after = proc_waits.sample(record["pid"], proc_waits.JobPeers(roots=()))
            assert before is not None and after is not None
            seen = judge(before, after, 0.5, HANG)
            activity[rank] = Activity(0.0 if seen.progressing else 10 * HANG,
                                      seen.seen is Seen.STOPPED, seen.why)
        records = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
        snaps = {r: _snapshot(record) for r, record in records.items()}
        now = time.monotonic()
        verdicts = HangRules(2, HANG, 300.0).judge(snaps, activity, (), now)
        print(scenario, records, activity, [v.describe() for v in verdicts])
        assert verdicts, (records, activity)
        verdict = verdicts[0]
        assert (verdict.hung, verdict.blamed, verdict.reason) == (True, (1,), reason), \
            verdict.describe()
        assert verdict.op == "all_reduce" and verdict.seq == records[1]["completed"] + 1
    finally:
        for proc in procs:
            proctree.signal_tree(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
