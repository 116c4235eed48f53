"""The hang rules for asynchronous groups over real NCCL progress (``python -m pytest -m gpu``):
two NCCL ranks on GPU 0 keep their Flight Recorder counts in files; the test builds each
rank's snapshot from them, judges the ranks' processes from /proc, and the rules name rank 1
and the all-reduce it held up, for a rank asleep in Python (it never enqueued it) and for a
rank whose GPU is stuck in a kernel (it enqueued it, its GPU never started it). This is what
the launcher will do once NCCL groups reach the ledger. Skipped without a CUDA GPU."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rankguard import ledger as L
from rankguard.launcher.monitor import Activity, HangRules
from rankguard.launcher.progress import Seen
from tests.gpu.nccl_ranks import GPU_SET, await_files, judged, two_ranks
from tests.launcher.snapshots import ledger

pytestmark = GPU_SET

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
    with two_ranks("nccl_fr_sampler.py", [scenario, str(tmp_path)],
                   {"TORCH_NCCL_ENABLE_TIMING": "1"}) as procs:
        await_files([tmp_path / f"rank{r}.json" for r in (0, 1)], procs, "their fault")
        time.sleep(HANG + 1.0)  # the others wait a whole hang timeout
        records = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
        activity = {}
        for rank, record in records.items():
            seen, _ = judged(record["pid"], 0.5, HANG)
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
