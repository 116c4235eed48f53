"""A tensor-parallel MLP served over HTTP on CPU/gloo, where a rank can be made to fail
mid-forward: rankguard's serving example.

    rankguard serve examples/serve_tp.py:app --port 8000

    curl -s localhost:8000/run -d '{"x": [1, 2, 3, 4, 5, 6, 7, 8]}'
    curl -s localhost:8000/run -d '{"x": [1, 2, 3, 4, 5, 6, 7, 8], "fault": "stop:rank=1"}'
    curl -s localhost:8000/healthz; curl -s localhost:8000/metrics

The MLP is ``relu(x @ W1) @ W2``, split Megatron-style over the ranks: each rank holds a block
of W1's columns (column-parallel) and the matching block of W2's rows (row-parallel), computes
its partial output, and the partial outputs are summed with an all_reduce. Weights come from a
fixed seed, so :func:`reference` computes the same output in one process.

``fault`` injects a real fault into one rank between its matmuls and the all_reduce, while its
peers wait in the all_reduce: any kind of ``rankguard run --inject`` without ``at=`` or
``attempt=`` (``raise:rank=1``, ``crash:3:rank=0``, ``kill:rank=1``, ``stop:rank=1``,
``hang:rank=0``, ``gil:rank=1``...) naming one of the replica's ranks (another is answered 422).
The request fails with HTTP 500 naming the rank and the cause; the next one is served by a warm
spare group.
"""

from __future__ import annotations

from typing import Any

import rankguard
from rankguard.inject import perform, spec

D_IN, D_HIDDEN, D_OUT = 8, 32, 4
SEED = 1234
MAX_ABS = 1e30  # inputs up to this stay finite through the float32 MLP (float32 ends at 3.4e38)


def _weights() -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(SEED)
    w1 = torch.randn(D_IN, D_HIDDEN, generator=generator) / D_IN ** 0.5
    w2 = torch.randn(D_HIDDEN, D_OUT, generator=generator) / D_HIDDEN ** 0.5
    return w1, w2


def load_shard(rank: int, world_size: int) -> dict[str, Any]:
    """Each rank keeps its block of W1's columns and of W2's rows (done once, in spares too)."""
    if D_HIDDEN % world_size:
        raise ValueError(f"the hidden size {D_HIDDEN} does not split over {world_size} ranks")
    w1, w2 = _weights()
    block = D_HIDDEN // world_size
    part = slice(rank * block, (rank + 1) * block)
    return {"w1": w1[:, part].contiguous(), "w2": w2[part, :].contiguous(), "rank": rank}


def forward(shard: dict[str, Any], request: dict[str, Any]) -> list[float]:
    """One forward pass on every rank; rank 0's output is the response."""
    import torch
    import torch.distributed as dist

    x = torch.tensor(request["x"], dtype=torch.float32)
    partial = torch.relu(x @ shard["w1"]) @ shard["w2"]
    fault = request.get("fault")
    if fault is not None:
        injected = spec.parse(fault, what="fault", moment="now")
        if injected.rank == shard["rank"]:
            perform.perform(injected)
    dist.all_reduce(partial)
    return partial.tolist()


def validate(request: dict[str, Any]) -> dict[str, Any]:
    """Runs in every rank before ``forward``: a bad request is answered 422, and no rank fails
    on it (which would retire its replica)."""
    import torch.distributed as dist

    x = request.get("x")
    # a number a float32 cannot hold would fail a rank (and retire its replica) or give inf
    if (not isinstance(x, list) or len(x) != D_IN
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                       and abs(v) <= MAX_ABS for v in x)):
        raise ValueError(f"'x' must be a list of {D_IN} numbers, each from {-MAX_ABS:g} to "
                         f"{MAX_ABS:g}")
    fault = request.get("fault")
    if fault is not None:
        if not isinstance(fault, str):
            raise ValueError("'fault' must be a string such as 'stop:rank=1'")
        try:
            injected = spec.parse(fault, what="fault", moment="now")
        except rankguard.UsageError as error:
            raise ValueError(str(error)) from None
        world = dist.get_world_size()  # the replica's, whatever --world-size said
        if injected.rank >= world:
            raise ValueError(f"'fault' names rank {injected.rank}, but a replica has ranks 0 to "
                             f"{world - 1}: name one of them, e.g. 'stop:rank=1'")
    return request


def reference(x: list[float]) -> list[float]:
    """The same MLP in one process, unsplit."""
    import torch

    w1, w2 = _weights()
    return (torch.relu(torch.tensor(x, dtype=torch.float32) @ w1) @ w2).tolist()


app = rankguard.Service(handle=forward, setup=load_shard, validate=validate, world_size=2,
                        spares=1, timeout=5.0)
