"""The functions the pool benches (pool_bench, serve_load_bench, serve_heal_bench) run on the
ranks of a pool and of a plain group (module-level, so the ranks import them by name)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

SIZE = 128
SETUP_S_ENV = "BENCH_SETUP_S"  # seconds setup_placed sleeps, a stand-in for loading weights


def setup(rank: int, world_size: int, device: Any = "cpu") -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(rank)
    return {"w": (torch.randn(SIZE, SIZE, generator=generator) / SIZE ** 0.5).to(device),
            "x": torch.randn(SIZE, SIZE, generator=generator).to(device), "rank": rank}


def setup_placed(rank: int, world_size: int) -> dict[str, Any]:
    """:func:`setup` on the device the pool placed this rank on (``rankguard.device()``: a GPU
    with ``Pool(devices=)``, else the CPU), after sleeping ``BENCH_SETUP_S`` seconds (default
    0), as a rank loading its shard's weights would."""
    import rankguard

    time.sleep(float(os.environ.get(SETUP_S_ENV) or 0))
    return setup(rank, world_size, rankguard.device())


def forward(state: dict[str, Any], work: int, fault: str | None = None) -> float:
    """``work`` matmuls, then an all_reduce of the result; ``fault`` (an ``--inject`` spec
    without ``at=``, e.g. ``kill:rank=1``) is performed between the two by its rank."""
    import torch.distributed as dist

    from rankguard.inject import perform, spec

    y = state["x"]
    for _ in range(work):
        y = y @ state["w"]
    if fault is not None:
        injected = spec.parse(fault, what="fault", moment="now")
        if injected.rank == state["rank"]:
            perform.perform(injected)
    dist.all_reduce(y)
    return float(y[0, 0])


def die(state: Any) -> None:
    """Every rank SIGKILLs itself: nothing of the replica is left to keep."""
    os.kill(os.getpid(), signal.SIGKILL)


def calibrate(seconds: float) -> int:
    """How many matmuls take about ``seconds`` here, on one thread."""
    import torch

    torch.set_num_threads(1)
    state = setup(0, 1)
    y, n, started = state["x"], 0, time.perf_counter()
    while time.perf_counter() - started < 0.2:
        y = y @ state["w"]
        n += 1
    return max(1, round(n * seconds / (time.perf_counter() - started)))
