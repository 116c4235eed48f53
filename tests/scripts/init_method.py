"""``init_method.py MODE [PORT]``: init_process_group through a store named by the script, then
one all_reduce. MODE: ``tcp`` (init_method tcp://127.0.0.1:PORT), ``master``
(tcp://MASTER_ADDR:MASTER_PORT, the launcher's store), ``env`` (env:// after setting
MASTER_PORT to PORT, as scripts written for mp.spawn do)."""
import os
import sys

import torch
import torch.distributed as dist

mode = sys.argv[1]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if mode == "env":
    os.environ["MASTER_PORT"] = sys.argv[2]
    dist.init_process_group("gloo")
else:
    port = os.environ["MASTER_PORT"] if mode == "master" else sys.argv[2]
    host = os.environ["MASTER_ADDR"] if mode == "master" else "127.0.0.1"
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank,
                            world_size=world)
t = torch.ones(2)
dist.all_reduce(t)
print(f"OK rank={rank} sum={t.tolist()}", flush=True)
dist.destroy_process_group()
