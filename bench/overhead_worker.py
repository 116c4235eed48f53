"""All-reduce timing loop for bench/overhead_bench.py: prints 'per_op_us=X' on rank 0."""
import os
import sys
import time

import torch
import torch.distributed as dist

numel, iters = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
t = torch.ones(numel)
for _ in range(max(10, iters // 10)):
    dist.all_reduce(t)
dist.barrier()
best = float("inf")
for _ in range(3):
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    best = min(best, (time.perf_counter() - start) / iters)
if dist.get_rank() == 0:
    print(f"per_op_us={best * 1e6:.2f} class={type(dist.group.WORLD).__name__}", flush=True)
dist.destroy_process_group()
