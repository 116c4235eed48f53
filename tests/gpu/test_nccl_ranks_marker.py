"""``@pytest.mark.ranks(2, devices=[0, 0])``: distributed tests on warm NCCL ranks sharing GPU 0
(``python -m pytest -m gpu``). A passing test runs on the GPU; a test where rank 1 never joins
rank 0's all_reduce fails within its deadline naming the collective and how long it had; the
test after it passes on healthy ranks. Skipped without a CUDA GPU."""

from __future__ import annotations

import re
from pathlib import Path

from tests.gpu.nccl_ranks import GPU_SET, ONE_GPU
from tests.testing.suite import run_suite

pytestmark = GPU_SET

SUITE = '''
import pytest
import torch
import torch.distributed as dist

import rankguard

ON_GPU = pytest.mark.ranks(2, devices=[0, 0])

@ON_GPU
def test_all_reduce_on_the_gpu():
    assert dist.get_backend() == "nccl" and rankguard.device() == torch.device("cuda:0")
    t = torch.ones(3, device=rankguard.device())
    dist.all_reduce(t)
    assert t.tolist() == [2.0, 2.0, 2.0]

@ON_GPU
@pytest.mark.deadline(8)
def test_rank1_never_joins():
    if dist.get_rank() == 0:
        t = torch.ones(1, device=rankguard.device())
        dist.all_reduce(t)
        torch.cuda.synchronize()

@ON_GPU
def test_good_after():
    t = torch.ones(3, device=rankguard.device())
    dist.all_reduce(t)
    assert t.tolist() == [2.0, 2.0, 2.0]
'''


def test_nccl_ranks_tests_pass_and_a_hang_is_bounded_and_named(tmp_path: Path) -> None:
    session = run_suite(tmp_path, {"test_nccl.py": SUITE}, [], timeout=150, env=ONE_GPU)
    assert session.result("test_all_reduce_on_the_gpu") == "passed", session.output
    assert session.result("test_rank1_never_joins") == "failed", session.output
    text = session.text("test_rank1_never_joins")
    # the warm ranks count their collectives across tests: this one is the session's second
    assert re.search(r"all_reduce #\d+ on group 'world' passed its deadline", text), text
    assert "ranks that had not arrived: 1" in text, text
    assert session.result("test_good_after") == "passed", session.output
