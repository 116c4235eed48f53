"""Rank 0 waits on something outside the job for SECONDS while rank 1 waits at a barrier:
``waits_outside.py KIND SECONDS [URL]``. KIND: ``busy_child`` (a child that burns CPU),
``sleep_child`` (``sleep``), ``url`` (an HTTP server that answers late), ``captured_child``
(``sleep`` with its output captured: rank 0 polls the child's pipes), ``poll`` (a loop of
1.5 s sleeps until a file appears), ``fifo`` (opening a FIFO that a child writes into late)."""
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import torch.distributed as dist

kind, seconds = sys.argv[1], float(sys.argv[2])
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 0:
    if kind == "busy_child":
        subprocess.run([sys.executable, "-c", "import time\nend = time.monotonic() + "
                        f"{seconds}\nwhile time.monotonic() < end: pass"], check=True)
    elif kind == "sleep_child":
        subprocess.run(["sleep", str(seconds)], check=True)
    elif kind == "captured_child":
        subprocess.run(["sleep", str(seconds)], check=True, capture_output=True)
    elif kind == "url":
        assert urllib.request.urlopen(sys.argv[3], timeout=seconds * 10).read() == b"late"
    elif kind in ("poll", "fifo"):
        path = os.path.join(tempfile.mkdtemp(), "flag")
        if kind == "fifo":
            os.mkfifo(path)
        writer = subprocess.Popen(["sh", "-c", f"sleep {seconds}; echo done > {path}"])
        if kind == "poll":
            while not os.path.exists(path):
                time.sleep(1.5)
        else:
            with open(path) as fifo:
                assert fifo.read() == "done\n"
        writer.wait()
dist.barrier()
print(f"rank {dist.get_rank()} done", flush=True)
dist.destroy_process_group()
