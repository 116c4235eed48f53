"""``rankguard.shutdown()`` on NCCL (``python -m pytest -m gpu``), two ranks on GPU 0: when
every rank calls it, the group is destroyed (no hang in ``destroy_process_group``); when rank 1
never does, rank 0's call returns within its 5 s barrier plus the abort's bound, reports rank 1
missing, and its CUDA tensors and the GPU stay usable. Skipped without a CUDA GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gpu.nccl_ranks import GPU_SET, await_files, two_ranks

pytestmark = GPU_SET

BARRIER_S = 5.0
ABORT_S = 10.0  # nccl_abort's bound on the abort of a group a peer left


@pytest.mark.parametrize("mode", ["clean", "missing"])
def test_shutdown_on_nccl_is_bounded_and_leaves_the_gpu_usable(tmp_path: Path, mode: str) -> None:
    ranks = (0, 1) if mode == "clean" else (0,)
    with two_ranks("nccl_shutdown.py", [mode, str(tmp_path)]) as procs:
        await_files([tmp_path / f"rank{rank}.json" for rank in ranks], procs, "their shutdown")
        results = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text())
                   for rank in ranks}
        if mode == "clean":
            for proc in procs:
                assert proc.wait(timeout=60) == 0
    print(results)
    for rank, result in results.items():
        assert result["intact"] and result["after"] == 8.0, (rank, result)
        assert not result["initialized"], (rank, result)  # destroyed, or aborted and destroyed
        if mode == "clean":
            assert result["clean"] and result["took"] < BARRIER_S, (rank, result)
        else:
            assert not result["clean"] and result["missing"] == [1], (rank, result)
            assert result["took"] < BARRIER_S + ABORT_S + 1.0, (rank, result)
