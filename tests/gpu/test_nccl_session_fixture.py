"""The Megatron-LM case on NCCL (``python -m pytest -m gpu``), two ranks sharing GPU 0: under
``torchrun -m pytest`` and ``rankguard run -m pytest``, rank 1 fails a test while rank 0 waits
inside that test's NCCL all_reduce, then the session fixture calls ``barrier()`` and
``destroy_process_group()``: bounded, both reported, nothing left running. The same on gloo is
in tests/testing/test_plugin_megatron.py. Skipped without a CUDA GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.gpu.nccl_ranks import GPU_SET, ONE_GPU
from tests.testing import megatron_case as case

pytestmark = GPU_SET

DEADLINE = 20.0
# GPU run 3 saw rank 1 die of SIGABRT with no word of why: Python's fault handler prints every
# thread's stack on that signal (which thread aborted), torch the C++ stack of its errors
DIAGNOSE = {**ONE_GPU, "PYTHONFAULTHANDLER": "1", "TORCH_SHOW_CPP_STACKTRACES": "1"}


def test_under_torchrun_a_failing_rank_and_its_peer_waiting_on_the_gpu_end_bounded(
        tmp_path: Path) -> None:
    run = case.under_torchrun(tmp_path, "nccl", DEADLINE, env=DIAGNOSE)
    print(f"torchrun -m pytest ended with {run.code} after {run.wall_s:.1f} s")
    case.check_bounded_and_both_reported(run, DEADLINE)


def test_under_rankguard_run_a_failing_rank_and_its_peer_waiting_on_the_gpu_end_bounded(
        run_rankguard: Any, tmp_path: Path) -> None:
    run = case.under_rankguard(run_rankguard, tmp_path, "nccl", DEADLINE, env=DIAGNOSE)
    print(f"rankguard run -m pytest ended with {run.code} after {run.wall_s:.1f} s")
    case.check_bounded_and_both_reported(run, DEADLINE)
