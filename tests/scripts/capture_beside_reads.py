"""CUDA graph captures on the main thread while another thread reads torch's NCCL Flight Recorder
entries (GPU set, ``tests/gpu/test_capture_beside_reads.py``).

    python capture_beside_reads.py guarded|raw SECONDS

A one-rank NCCL group on GPU 0 has an all_reduce queued behind a long kernel, so its entry is
not completed and every read of the entries queries its CUDA events. A reader thread reads them
for SECONDS: through rankguard's ``FlightRecorderReader`` (``guarded``: its thread in CUDA's
thread-local capture mode) or through torch's binding alone (``raw``). Meanwhile the main thread
captures small CUDA graphs in torch's default (global) mode, one after another. Prints
``CAPTURES ok=N failed=M READS ok=K failed=L thread_local=0|1`` (whether the reader thread
was in thread-local mode) and the first errors of each.
"""

import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from rankguard.runtime.capture_mode import thread_local_for_this_thread
from rankguard.runtime.fr_progress import FlightRecorderReader, Recorder

how, seconds = sys.argv[1], float(sys.argv[2])
os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
torch.cuda.set_device(0)
device = torch.device("cuda", 0)
dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
dist.all_reduce(torch.ones(8, device=device))  # the communicator, outside any capture
torch.cuda.synchronize()
# an entry that stays in flight: its all_reduce waits behind a kernel of about SECONDS + 1 s
torch.cuda._sleep(int((seconds + 1.0) * 2e9))
dist.all_reduce(torch.ones(8, device=device))

reader = FlightRecorderReader(Recorder.NCCL)
raw = torch._C._distributed_c10d._dump_nccl_trace
reads = {"ok": 0, "failed": 0, "thread_local": 0}
read_errors: list[str] = []
stop = threading.Event()


def read() -> None:
    while not stop.is_set():
        try:
            if how == "guarded":
                reader.entries(only_active=True)
            else:
                raw(True, False, True)
            reads["ok"] += 1
            reads["thread_local"] = int(how == "guarded" and thread_local_for_this_thread())
        except Exception as error:  # noqa: BLE001 (counted and shown)
            reads["failed"] += 1
            read_errors.append(repr(error)[:200])


captures = {"ok": 0, "failed": 0}
capture_errors: list[str] = []
side = torch.cuda.Stream()
value = torch.ones(1 << 16, device=device)
thread = threading.Thread(target=read, daemon=True)
thread.start()
until = time.monotonic() + seconds
while time.monotonic() < until:
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
            for _ in range(20):
                value.mul_(1.0)
        captures["ok"] += 1
    except Exception as error:  # noqa: BLE001 (counted and shown)
        captures["failed"] += 1
        capture_errors.append(repr(error)[:200])
        torch.cuda.synchronize(side)
stop.set()
thread.join(10)
print(f"CAPTURES ok={captures['ok']} failed={captures['failed']} "
      f"READS ok={reads['ok']} failed={reads['failed']} thread_local={reads['thread_local']}",
      flush=True)
for error in capture_errors[:2] + read_errors[:2]:
    print(f"ERROR {error}", flush=True)
torch.cuda.synchronize()
dist.destroy_process_group()
