"""Several nodes: ``node_env.py STEPS [PAUSE_S]``: all_reduce STEPS times across every node's
ranks (PAUSE_S apart), check the sum, and print this rank's torchrun environment as one JSON line
(``ENV {...}``). Prints ``STEPPED`` after its first all_reduce."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
dist.init_process_group("gloo")
world = dist.get_world_size()
for step in range(steps):
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    assert t.item() == world * (world - 1) / 2, t
    if step == 0:
        print("STEPPED", flush=True)
    time.sleep(pause)
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
         "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
         "RANKGUARD_ROUND")
env = {name: os.environ.get(name) for name in names}
env["dist_rank"], env["dist_world"] = dist.get_rank(), world
print("ENV " + json.dumps(env), flush=True)
dist.destroy_process_group()
