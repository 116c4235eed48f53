"""Every rank makes collectives that gloo refuses at once (wrong sizes) and catches the error,
then goes on healthily: collectives, a quiet stretch longer than the hang timeout
(argv[1] seconds, asleep), a monitored_barrier, and a last all_reduce. Nothing hangs."""
import sys
import time

import torch
import torch.distributed as dist

quiet_s = float(sys.argv[1])
dist.init_process_group("gloo")
for _ in range(3):
    try:
        dist.all_gather([torch.ones(3)] * dist.get_world_size(), torch.ones(2))
    except (RuntimeError, ValueError):
        pass
t = torch.ones(4)
for _ in range(20):
    dist.all_reduce(t)
time.sleep(quiet_s)
dist.monitored_barrier()
dist.all_reduce(t)
print(f"rank {dist.get_rank()} OK", flush=True)
dist.destroy_process_group()
