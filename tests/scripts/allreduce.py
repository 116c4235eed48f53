"""All-reduce loop: ``allreduce.py STEPS [SLEEP_S] [keep]``; prints its environment facts at the
end. With ``keep`` the group is never destroyed (left to interpreter exit)."""
import os
import sys
import time

import torch
import torch.distributed as dist

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.01
dist.init_process_group("gloo")
t = torch.ones(8)
world = dist.get_world_size()
for _ in range(steps):
    dist.all_reduce(t)
    t /= world  # every rank contributed 1: back to exactly 1
    time.sleep(pause)
assert torch.equal(t, torch.ones(8)), t
print(f"OK rank={dist.get_rank()} backend={dist.get_backend()} local_rank={os.environ['LOCAL_RANK']}"
      f" world={world} restart={os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
if sys.argv[3:] != ["keep"]:
    dist.destroy_process_group()
