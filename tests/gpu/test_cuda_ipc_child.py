"""The cuda-python case on a GPU (``python -m pytest -m gpu``): a test spawns a child that holds
a CUDA IPC handle of the parent's memory (torch.multiprocessing sharing a CUDA tensor); the
child wedges, the parent's join times out and its cleanup blocks: the plugin names the child,
ends it before the parent blocks for good, and the session goes on. The same on the CPU is in
tests/testing/test_plugin_deadlines_and_leaks.py. Skipped without a CUDA GPU."""

from __future__ import annotations

from pathlib import Path

from tests.gpu.nccl_ranks import GPU_SET
from tests.testing import ipc_child_case

pytestmark = GPU_SET

DEADLINE = 20.0  # the child's CUDA context takes seconds to make


def test_a_spawned_child_wedged_holding_a_cuda_ipc_handle_is_named_and_released(
        tmp_path: Path) -> None:
    ipc_child_case.check_named_released_and_the_session_goes_on(
        ipc_child_case.run(tmp_path, "cuda", DEADLINE))
