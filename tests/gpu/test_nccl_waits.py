"""What /proc shows of NCCL ranks (``python -m pytest -m gpu``): a rank asleep in Python while
its peer waits on the GPU is frozen by the hang rules' judgement of its process tree (NCCL's
own threads do not make it look busy), and the peer blocked behind the collective is seen as
it is. Two real NCCL ranks on GPU 0 (``NCCL_HOSTID`` each). Skipped without a CUDA GPU."""

from __future__ import annotations

import time
from pathlib import Path

from rankguard.launcher.progress import Seen
from tests.gpu.nccl_ranks import GPU_SET, await_files, judged, two_ranks

pytestmark = GPU_SET


def test_a_rank_asleep_in_python_is_frozen_while_its_nccl_peer_waits(tmp_path: Path) -> None:
    with two_ranks("nccl_sleeper.py", [str(tmp_path)]) as procs:
        await_files([tmp_path / f"rank{r}" for r in (0, 1)], procs,
                    "their first 10 all-reduces")
        time.sleep(2.0)  # rank 0 reaches its synchronize, rank 1 its sleep
        seen = {}
        for rank in (0, 1):
            seen[rank], after = judged(int((tmp_path / f"rank{rank}").read_text()), 1.0)
            print(f"rank {rank}: {seen[rank]}; threads: "
                  + ", ".join(f"{t.state}/{t.call.value}/{t.what}" for t in after.threads))
        assert seen[1].seen is Seen.FROZEN, seen
