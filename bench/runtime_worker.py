"""The rank program of bench/runtime_bench.py, started as plain env:// processes.

MODE=rankguard|handler (SIGTERM): rank 1 stops itself before an all_reduce that rank 0 enters;
rank 0 has either ``rankguard.init()`` or a plain ``signal.signal(SIGTERM, sys.exit)`` handler.
Writes ready.RANK (pid) once rank 0 is about to enter the collective.

MODE=regroup: rank 3 kills itself before all-reduce 20 (writing fault = wall time); the
survivors catch the error, regroup, and write regrouped.RANK = "<wall time of the first
all-reduce of the new generation> <seconds regroup() took>".
"""
import os
import signal
import sys
import time

mode = os.environ["MODE"]
out = os.environ["BENCH_DIR"]
rank = int(os.environ["RANK"])


def note(name: str, value: str) -> None:
    tmp = os.path.join(out, f".{name}.{rank}")
    with open(tmp, "w") as f:
        f.write(value)
    os.rename(tmp, os.path.join(out, f"{name}.{rank}"))


if mode in ("rankguard", "regroup"):
    import rankguard

    rankguard.init(grace=5)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
t = torch.ones(256)
dist.all_reduce(t)
if mode != "regroup":
    if rank == 1:
        note("ready", str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    note("ready", str(os.getpid()))
    dist.all_reduce(t)
    sys.exit(0)
try:
    for step in range(1, 1000):
        if rank == 3 and step == 20:
            note("fault", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(t)
except (rankguard.CollectiveError, rankguard.GroupRetired):
    generation = rankguard.regroup(timeout=10)
    dist.all_reduce(t)
    note("regrouped", f"{time.time()!r} {generation.took!r}")
    rankguard.shutdown(timeout=5)
