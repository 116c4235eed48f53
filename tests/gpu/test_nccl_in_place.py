"""``rankguard run --recovery in-place`` of a DDP job on NCCL (``python -m pytest -m gpu``), two
ranks sharing GPU 0: rank 1 is SIGKILLed before its step 20 (``at=step20``: DDP issues its
all_reduce from C++, where ``at=opN`` cannot count it); rank 0 is released by the communicator's
abort (the launcher's notice), a new process takes rank 1's place in a new NCCL generation,
receives the model and optimizer over NCCL from rank 0, DDP is rebuilt, and the run ends with
the parameters of a run without the fault, bit for bit. Skipped without a CUDA GPU."""

from __future__ import annotations

import re
from typing import Any

from tests.conftest import ROOT
from tests.gpu.nccl_ranks import GPU_SET, ONE_GPU

pytestmark = GPU_SET

EXAMPLE = str(ROOT / "examples" / "train_inplace.py")
ARGS = ["--nproc-per-node", "2", "--hang-timeout", "10", "--max-restarts", "2"]
SCRIPT = [EXAMPLE, "--device", "cuda", "--steps", "40", "--step-time", "0.02", "--width", "16"]
REPLACED_S = 20.0


def _checksum(stdout: str) -> str:
    found = re.findall(r"checksum ([0-9a-f]{16})", stdout)
    assert found, stdout[-3000:]
    return found[-1]


def test_a_killed_nccl_rank_is_replaced_in_place_and_the_run_ends_bit_for_bit(
        run_rankguard: Any) -> None:
    clean = run_rankguard([*ARGS, *SCRIPT], timeout=120, env=ONE_GPU)
    assert clean.code == 0, clean.stderr[-3000:]
    run = run_rankguard([*ARGS, "--recovery", "in-place", "--inject", "kill:rank=1,at=step20",
                         *SCRIPT], timeout=150, env=ONE_GPU)
    print("\n".join(line for line in run.stdout.splitlines() if "recovered" in line))
    assert run.code == 0, run.stderr[-4000:]
    assert _checksum(run.stdout) == _checksum(clean.stdout)
    (replace,) = [e for e in run.events if e["event"] == "replace"]
    (replaced,) = [e for e in run.events if e["event"] == "replaced"]
    assert replace["rank"] == replaced["rank"] == 1
    # from the fault to the replacement holding the state (the next step follows at once): a
    # bound, not the figure (bench/in_place_bench.py --device cuda measures it). The spare is
    # started at the first step, 0.4 s before the kill, so the replacement pays most of a cold
    # start: Python and torch, torch._dynamo (the optimizer), CUDA, the new NCCL group, beside
    # three other tests' ranks on the same GPU
    print(f"replace -> replaced: {replaced['ts'] - replace['ts']:.2f} s")
    assert replaced["ts"] - replace["ts"] < REPLACED_S, (replace, replaced)
