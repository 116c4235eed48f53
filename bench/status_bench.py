"""Does watching a job with ``rankguard status`` slow it? The same job, alone and watched.

    python bench/status_bench.py [--runs 5] [--steps 300] [--interval 0.1]

Runs ``examples/train.py`` (2 ranks, ``--steps`` steps, no extra step time) under
``rankguard run``, alternately alone and with ``rankguard status --interval S`` attached on a
pseudo-terminal (its live view, redrawn every S seconds: 10 times the default rate at 0.1), and
prints the medians of the job's time from its first step to its end (from its journal), their
ratio, and the CPU the status view used per second of watching.
"""
from __future__ import annotations

import argparse
import json
import os
import pty
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_S = 300  # a job or a view that takes longer is stopped


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rankguard.cli", *args]


def _job_seconds(journal: str) -> float:
    events = [json.loads(line) for line in open(journal)]
    first = next(e["ts"] for e in events if e["event"] == "first_step")
    end = next(e["ts"] for e in events if e["event"] == "run_end")
    return end - first


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        pass


def one_run(folder: str, steps: int, watch_interval: float | None) -> tuple[float, float]:
    """(the job's seconds from first step to end, the view's CPU seconds per second watched)."""
    log_dir = os.path.join(folder, f"run{time.monotonic_ns()}")
    job = subprocess.Popen(_cli("run", "--master-port", "0", "--no-tee", "--log-dir", log_dir,
                                "--nproc-per-node", "2", "examples/train.py", "--steps",
                                str(steps), "--step-time", "0", "--ckpt-every", "100000"),
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cpu_per_s = 0.0
    if watch_interval is not None:
        journal = os.path.join(log_dir, "journal.jsonl")
        deadline = time.monotonic() + 60
        while not os.path.exists(journal) and time.monotonic() < deadline:
            time.sleep(0.05)
        master, slave = pty.openpty()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        view = subprocess.Popen(_cli("status", "--interval", str(watch_interval), log_dir),
                                cwd=ROOT, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL)
        os.close(slave)
        reader = threading.Thread(target=_drain, args=(master,), daemon=True)
        reader.start()
        view.wait(timeout=RUN_S)  # it exits when the run has ended
        watched = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        os.close(master)
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        cpu_per_s = cpu / watched if watched > 0 else 0.0
    if job.wait(timeout=RUN_S) != 0:
        sys.exit(f"the job failed (exit code {job.returncode}); logs in {log_dir}")
    return _job_seconds(os.path.join(log_dir, "journal.jsonl")), cpu_per_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--interval", type=float, default=0.1,
                        help="the status view's refresh, seconds (default 0.1)")
    args = parser.parse_args()
    alone, watched, cpu = [], [], []
    with tempfile.TemporaryDirectory(prefix="rankguard-bench-") as folder:
        for index in range(args.runs):
            print(f"run {index + 1} of {args.runs}...", file=sys.stderr)
            alone.append(one_run(folder, args.steps, None)[0])
            seconds, used = one_run(folder, args.steps, args.interval)
            watched.append(seconds)
            cpu.append(used)
    a, w = statistics.median(alone), statistics.median(watched)
    print(f"{args.steps} steps of examples/train.py on 2 ranks, medians of {args.runs} runs each, "
          "alternating:")
    watched_label = f"with rankguard status --interval {args.interval:g} on a tty"
    print(f"  {'alone':<{len(watched_label)}}  {a:7.2f} s")
    print(f"  {watched_label}  {w:7.2f} s   ratio {w / a:.3f}")
    print(f"  (each run alone: {', '.join(f'{x:.2f}' for x in alone)}; watched: "
          f"{', '.join(f'{x:.2f}' for x in watched)})")
    print(f"  the status view's CPU: {statistics.median(cpu) * 100:.1f}% of one core while it "
          "watched")
    return 0


if __name__ == "__main__":
    sys.exit(main())
