"""Cost per collective of bounded mode and of a deadline, in one process (bench/runtime_bench.py).

Paired, interleaved rounds (each variant right after a plain round) of a 1-rank all_reduce (as
``dist.all_reduce`` issues it, then ``wait()``) on: a plain gloo process group as torch builds one; rankguard's group on its zero-code
path (what ``rankguard run`` gives); the same group in bounded mode (``rankguard.init()``: a
BoundedWork per op, waited in slices); and bounded mode inside ``rankguard.deadline(60)`` (the
remaining time is also set as gloo's per-op timeout). Medians of per-op microseconds, and of the
differences to the plain group.
"""
import statistics
import time

import torch
import torch.distributed as dist

import rankguard
from plain_group import side_by_side
from rankguard.runtime import state

rankguard.init()
ours, plain, _ = side_by_side()
t = torch.ones(1)


def per_op_us(pg, bounded: bool, limit: bool, n: int = 2000) -> float:
    state.current().bounded = bounded
    opts = dist.AllreduceOptions()
    opts.asyncOp = False  # as dist.all_reduce issues it
    start = time.perf_counter()
    if limit:
        with rankguard.deadline(60):
            for _ in range(n):
                pg.allreduce([t], opts).wait()
    else:
        for _ in range(n):
            pg.allreduce([t], opts).wait()
    return (time.perf_counter() - start) / n * 1e6


variants = {"zero_code": (ours, False, False), "bounded": (ours, True, False),
            "deadline": (ours, True, True)}
for args in variants.values():
    per_op_us(*args, n=300)
pairs: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
for _ in range(15):
    for name, args in variants.items():
        pairs[name].append((per_op_us(plain, False, False), per_op_us(*args)))
print(f"plain_us={statistics.median(p for v in pairs.values() for p, _ in v):.2f}")
for name, measured in pairs.items():
    print(f"{name}_us={statistics.median(o for _, o in measured):.2f}")
    print(f"{name}_diff_us={statistics.median(o - p for p, o in measured):.2f}")
state.current().bounded = True
rankguard.shutdown(timeout=5)
