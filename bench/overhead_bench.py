"""Cost of rankguard's instrumentation per collective, against the same loop under torchrun.

    python bench/overhead_bench.py

Two loops, each run under both launchers (best of 3 passes inside one run):
- 1 rank, a 1-float all_reduce, 5,000 times: the fixed cost per collective in microseconds;
- 4 ranks, a 1 MB all_reduce, 100 times: the share of a real collective's time.
Then bench/overhead_inprocess.py: plain gloo and rankguard's group in one process, in paired
rounds, and the cost of the instrumentation steps alone.
"""
from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "overhead_worker.py")


def per_op_us(which: str, nproc: int, numel: int, iters: int) -> float:
    if which == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}"]
    else:
        cmd = [sys.executable, "-m", "rankguard.cli", "run", "--master-port", "0",
               "--nproc-per-node", str(nproc)]
    out = subprocess.run([*cmd, WORKER, str(numel), str(iters)], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    line = next(x for x in out.splitlines() if "per_op_us=" in x)
    value = float(line.split("per_op_us=")[1].split()[0])
    if which == "rankguard":
        assert "class=InstrumentedGroup" in line, line  # the loop really ran instrumented
    return value


def main() -> None:
    print(f"{'loop':40} {'rankguard':>12} {'torchrun':>12} {'overhead':>12}")
    for label, nproc, numel, iters in (("1 rank, 4 B all_reduce x5000", 1, 1, 5000),
                                       ("4 ranks, 1 MB all_reduce x100", 4, 262144, 100)):
        ours = per_op_us("rankguard", nproc, numel, iters)
        theirs = per_op_us("torchrun", nproc, numel, iters)
        print(f"{label:40} {ours:>9.2f} us {theirs:>9.2f} us {ours - theirs:>+8.2f} us"
              f" ({(ours / theirs - 1) * 100:+.1f}%)")
    out = subprocess.run([sys.executable, os.path.join(HERE, "overhead_inprocess.py")],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    found = dict(line.split("=") for line in out.split() if "=" in line)
    print(f"in one process, 1 rank, median of 31 paired rounds: plain gloo "
          f"{found['paired_plain_us']} us, rankguard {found['paired_ours_us']} us, "
          f"difference {found['paired_diff_us']} us")
    print(f"instrumentation steps alone: ledger enter {found['ledger_enter_us']} us + completion "
          f"tracking {found['completion_add_us']} us")


if __name__ == "__main__":
    main()
