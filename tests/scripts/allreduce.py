"""All-reduce loop: ``allreduce.py STEPS [SLEEP_S]``; prints its environment facts at the end."""
import os
import sys
import time

import torch
import torch.distributed as dist

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.01
dist.init_process_group("gloo")
t = torch.ones(8)
for _ in range(steps):
    dist.all_reduce(t)
    time.sleep(pause)
world = dist.get_world_size()
assert t[0].item() == world ** steps, t
print(f"OK rank={dist.get_rank()} backend={dist.get_backend()} local_rank={os.environ['LOCAL_RANK']}"
      f" world={world} restart={os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
dist.destroy_process_group()
