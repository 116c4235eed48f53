"""NCCL ranks that keep their Flight Recorder progress in a file, for the GPU set's verdicts
over real data: ``nccl_fr_sampler.py SCENARIO FOLDER``. Every rank is on GPU 0 (its own
``NCCL_HOSTID``), with the devices' start times recorded; a helper thread reads the default
group's enqueued/started/completed every 50 ms (``runtime.fr_progress``) and writes them, with
when each last moved (the monotonic clock, one for every process of the machine), to
FOLDER/rankR.json. After 10 all-reduces: rank 1 sleeps (``sleep``: it never enqueues #11) or
its GPU runs a long kernel before #11 (``gpu_stuck``: it enqueues, its GPU never starts), while
rank 0 enqueues 10 more and waits for its GPU. Both are killed by the test."""
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from rankguard.runtime import fr_progress as fr

os.environ.setdefault("NCCL_HOSTID", f"host{os.environ['RANK']}")
scenario, folder = sys.argv[1], sys.argv[2]
torch.cuda.set_device(0)
dist.init_process_group("nccl")
rank = dist.get_rank()
reader = fr.FlightRecorderReader(fr.Recorder.NCCL)
moved: dict[str, float] = {}
last: dict[str, int] = {}


def sample() -> None:
    while True:
        counts = reader.read().groups.get(0)
        if counts is not None:
            now = time.monotonic()
            for name in ("enqueued", "completed"):
                if last.get(name) != getattr(counts, name):
                    last[name], moved[name] = getattr(counts, name), now
            record = {"enqueued": counts.enqueued, "started": counts.started,
                      "completed": counts.completed, "t_enqueued": moved["enqueued"],
                      "t_completed": moved["completed"], "pid": os.getpid(), "at": now,
                      "stage": stage}
            path = os.path.join(folder, f"rank{rank}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(record, f)
            os.replace(path + ".tmp", path)
        time.sleep(0.05)


stage = "warming"
t = torch.ones(1024, device="cuda")
for _ in range(10):
    dist.all_reduce(t)
torch.cuda.synchronize()
threading.Thread(target=sample, daemon=True).start()
stage = "faulted"
if rank == 1 and scenario == "sleep":
    time.sleep(600)
if rank == 1 and scenario == "gpu_stuck":
    torch.cuda._sleep(2**62)  # the device spins; the CPU goes on enqueueing behind it
for _ in range(10):
    dist.all_reduce(t)
torch.cuda.synchronize()
time.sleep(600)
