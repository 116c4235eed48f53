"""The rank runtime against its peers, on this machine, one run, figures side by side.

    python bench/runtime_bench.py [--repeat 5] [--cap 15]

1. SIGTERM -> exit of a rank blocked in an all_reduce whose peer is frozen (2 plain env://
   ranks): ``rankguard.init()`` against a plain ``signal.signal(SIGTERM, sys.exit)`` handler,
   which does not run until gloo gives up (30 min); we stop waiting at --cap.
2. A rank of 4 is SIGKILLed at its 20th all-reduce: time to the first all-reduce of the
   survivors' new generation (``rankguard.regroup()``, no process restarted), against a cold
   restart under stock torchrun (``--max-restarts 1``; all four ranks start again).
3. Cost per collective of bounded mode and of a deadline (bench/deadline_overhead.py).

Medians of --repeat runs for rows 1 and 2 (torchrun's restart: one run, it takes the cap).
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import launcher_bench  # noqa: E402  (its torchrun restart measurement)

WORKER = os.path.join(HERE, "runtime_worker.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(mode: str, world: int, out: str) -> list[subprocess.Popen]:
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {**os.environ, "MODE": mode, "BENCH_DIR": out, "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port, "RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, WORKER], env=env, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def wait_files(pattern: str, count: int, cap: float) -> list[str]:
    deadline = time.monotonic() + cap
    while time.monotonic() < deadline:
        found = sorted(glob.glob(pattern))
        if len(found) >= count:
            return found
        time.sleep(0.005)
    return sorted(glob.glob(pattern))


def stop_all(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def sigterm_exit(mode: str, cap: float) -> tuple[float | None, int | None]:
    """Seconds from SIGTERM to rank 0's exit (None: not within cap), and its exit code."""
    out = tempfile.mkdtemp(prefix="bench-rt-")
    procs = start(mode, 2, out)
    try:
        ready = wait_files(os.path.join(out, "ready.*"), 2, 60)
        if len(ready) < 2:
            return None, None
        time.sleep(0.3)  # rank 0 is inside the all_reduce now
        sent = time.monotonic()
        procs[0].send_signal(signal.SIGTERM)
        try:
            code = procs[0].wait(cap)
        except subprocess.TimeoutExpired:
            return None, None
        return time.monotonic() - sent, code
    finally:
        stop_all(procs)
        shutil.rmtree(out, ignore_errors=True)


def regroup_recovery(cap: float) -> tuple[float | None, float | None]:
    """Seconds from the kill to the survivors' first all-reduce in the new generation (the
    slowest survivor), and the median time regroup() itself took."""
    out = tempfile.mkdtemp(prefix="bench-rt-")
    procs = start("regroup", 4, out)
    try:
        done = wait_files(os.path.join(out, "regrouped.*"), 3, cap)
        faults = glob.glob(os.path.join(out, "fault.*"))
        if len(done) < 3 or not faults:
            return None, None
        t_fault = float(open(faults[0]).read())
        values = [tuple(map(float, open(path).read().split())) for path in done]
        return max(v[0] for v in values) - t_fault, statistics.median(v[1] for v in values)
    finally:
        stop_all(procs)
        shutil.rmtree(out, ignore_errors=True)


def median(values: list[float | None]) -> float | None:
    good = [v for v in values if v is not None]
    return statistics.median(good) if len(good) == len(values) else None


def fmt(value: float | None, unit: str = "s", cap: float = 0.0) -> str:
    if value is None:
        return f"none in {cap:g} s" if cap else "n/a"
    return f"{value * 1000:.0f} ms" if unit == "ms" else f"{value:.2f} s"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--cap", type=float, default=15.0)
    args = p.parse_args()

    ours = [sigterm_exit("rankguard", args.cap) for _ in range(args.repeat)]
    plain = sigterm_exit("handler", args.cap)
    ours_s = median([t for t, _ in ours])
    print(f"{'':58} {'rankguard':>14} {'peer':>16}")
    print(f"{'SIGTERM -> exit, rank blocked in all_reduce (peer frozen)':58} "
          f"{fmt(ours_s, 'ms'):>14} {fmt(plain[0], cap=args.cap):>16}   "
          f"(peer: signal.signal handler)")
    print(f"{'  exit codes':58} {','.join(str(c) for _, c in ours):>14} "
          f"{str(plain[1]) if plain[1] is not None else 'still blocked':>16}")

    recoveries = [regroup_recovery(60) for _ in range(args.repeat)]
    recovery = median([r for r, _ in recoveries])
    took = median([t for _, t in recoveries])
    torchrun = launcher_bench.run_fault("torchrun", 4, "kill", 1, args.cap * 4)
    cold = torchrun.get("restart_first_step_s")
    ratio = f"{cold / recovery:.0f}x" if cold and recovery else "-"
    print(f"{'SIGKILL of 1 of 4 -> first all_reduce of the survivors/restart':58} "
          f"{fmt(recovery):>14} {fmt(cold, cap=args.cap * 4):>16}   (peer: torchrun cold "
          f"restart; {ratio})")
    print(f"{'  of which rankguard.regroup() itself':58} {fmt(took, 'ms'):>14}")

    overhead = subprocess.run([sys.executable, os.path.join(HERE, "deadline_overhead.py")],
                              capture_output=True, text=True, timeout=600).stdout
    figures = dict(line.split("=") for line in overhead.split())
    print(f"{'per-op, 1-rank all_reduce, plain gloo group':58} {'':>14} "
          f"{figures['plain_us'] + ' us':>16}")
    for name, label in (("zero_code", "rankguard run, no code change"),
                        ("bounded", "bounded mode (rankguard.init())"),
                        ("deadline", "bounded mode inside rankguard.deadline()")):
        print(f"{'  ' + label:58} {figures[name + '_us'] + ' us':>14} "
              f"{'+' + figures[name + '_diff_us'] + ' us':>16}")


if __name__ == "__main__":
    main()
