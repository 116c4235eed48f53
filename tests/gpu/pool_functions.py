"""Functions the GPU pool tests run on their NCCL ranks (module-level: the ranks import them by
name). ``fault`` is ``(rank, kind)``: that rank injects a real CUDA fault before its all_reduce,
while its peer waits for it in the all_reduce (the seed report's tensor-parallel forward)."""

from __future__ import annotations

import os
import signal
from typing import Any

import torch
import torch.distributed as dist

import rankguard

FAULTS = {  # kind -> (the cause the pool reports, whether the rank's process is replaced)
    "raise": ("raised", False),  # a bad request: an ordinary error, every process kept
    "oom": ("raised", True),  # CUDA out of memory: its reserved memory goes back with it
    "assert": ("raised", True),  # a device-side assert: its CUDA context is lost
    "kill": ("signalled", True),
    "spin": ("deadline", True),  # stuck in a GPU kernel past the request's deadline
}


def load(rank: int, world_size: int) -> dict[str, Any]:
    """A shard of weights on the rank's GPU."""
    return {"weight": torch.full((1 << 20,), float(rank + 1), device=rankguard.device())}


def forward(state: dict[str, Any], x: float, fault: tuple[int, str] | None = None) -> float:
    """Each rank scales its shard; the partial outputs are summed (a row-parallel all_reduce)."""
    out = state["weight"] * x
    if fault is not None and dist.get_rank() == fault[0]:
        inject(fault[1])
    dist.all_reduce(out)
    return float(out[0].item())


def expected(x: float, world_size: int) -> float:
    return x * sum(range(1, world_size + 1))


def inject(kind: str) -> None:
    device = rankguard.device()
    if kind == "raise":
        raise ValueError("a bad request")
    if kind == "oom":
        torch.empty(1 << 50, dtype=torch.uint8, device=device)  # a petabyte
    elif kind == "assert":
        index = torch.tensor([1 << 20], device=device)
        torch.zeros(4, device=device)[index].sum().item()  # out of bounds: device-side assert
    elif kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "spin":
        torch.cuda._sleep(1 << 62)  # a kernel that spins for good
        torch.cuda.synchronize()


def memory(state: Any) -> tuple[int, int]:
    """This rank's bytes allocated by torch, and the device's free bytes."""
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]


def pid(state: Any) -> int:
    return os.getpid()
