"""The forward that bench/pool_bench.py runs on both groups (importable by the ranks)."""

from __future__ import annotations

import time
from typing import Any

SIZE = 128


def setup(rank: int, world_size: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(rank)
    return {"w": torch.randn(SIZE, SIZE, generator=generator) / SIZE ** 0.5,
            "x": torch.randn(SIZE, SIZE, generator=generator), "rank": rank}


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
