"""rankguard run vs torchrun on the same machine and script: fault handling times.

    python bench/launcher_bench.py [--nproc 4] [--cap 60] [--repeat 5]

Prints, for each launcher: time from a rank's SIGKILL to every rank process gone; time from a
rank's SIGSTOP to the hang verdict (torchrun has none: it waits for gloo's 30 min timeout, so we
stop waiting at --cap); time from the fault to the first completed all-reduce of the restarted
attempt, for a fault at the 20th all-reduce (soon after the start: rankguard's warm spares are
still importing torch) and at the 400th (about 8 s in: spares ready); restart success over 20
restarts. All from one run, as ratios. The SIGKILL rows are
medians of --repeat runs; the SIGSTOP row is one run (torchrun takes the whole cap there).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from rankguard.processes import proctree

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "fault_worker.py")
RESTARTER = os.path.join(HERE, "..", "tests", "scripts", "restart_until.py")


def launcher_cmd(which: str, nproc: int, restarts: int, log_dir: str, extra: list[str]) -> list[str]:
    if which == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={nproc}", f"--max-restarts={restarts}", *extra]
    return [sys.executable, "-m", "rankguard.cli", "run", "--master-port", "0",
            "--nproc-per-node", str(nproc), "--max-restarts", str(restarts), "--hang-timeout", "3",
            "--log-dir", log_dir, *extra]


def pids_alive(pids: list[int]) -> bool:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1][0] != "Z":
                    return True
        except OSError:
            continue
    return False


def read_floats(pattern: str) -> list[float]:
    values = []
    for path in glob.glob(pattern):
        with open(path) as f:
            values += [float(x) for x in f.read().split()]
    return values


def run_fault(which: str, nproc: int, fault: str, restarts: int, cap: float,
              fault_at: int = 20) -> dict:
    d = tempfile.mkdtemp(prefix=f"bench-{which}-")
    env = {**os.environ, "BENCH_DIR": d, "FAULT": fault, "FAULT_RANK": "1",
           "FAULT_AT": str(fault_at), "STEPS": str(fault_at + 40), "OMP_NUM_THREADS": "1"}
    cmd = launcher_cmd(which, nproc, restarts, os.path.join(d, "logs"), [WORKER])
    start = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    result: dict = {}
    faults: list[float] = []
    while not faults and time.time() - start < cap:  # the file can exist before its content
        time.sleep(0.005)
        faults = read_floats(os.path.join(d, "fault.0"))
    if not faults:
        result["error"] = "fault never happened"
    else:
        t_fault = faults[0]
        pids = [int(x) for x in read_floats(os.path.join(d, "pid.*.0"))]
        while pids_alive(pids) and time.time() - t_fault < cap:
            time.sleep(0.002)
        gone = time.time()
        result["stop_s"] = gone - t_fault if not pids_alive(pids) else None
        if restarts:
            while time.time() - t_fault < cap:
                steps = read_floats(os.path.join(d, "step.*.1"))
                if len(steps) == nproc:
                    result["restart_first_step_s"] = max(steps) - t_fault
                    break
                time.sleep(0.01)
        journal = os.path.join(d, "logs", "journal.jsonl")
        if os.path.exists(journal):
            for line in open(journal):
                e = json.loads(line)
                if e["event"] == "hang_detected" and "verdict_s" not in result:
                    result["verdict_s"] = e["ts"] - t_fault
    try:
        proc.wait(timeout=max(1.0, cap - (time.time() - start)))
    except subprocess.TimeoutExpired:
        result["launcher_still_running_at_cap"] = True
    os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    for pid in [int(x) for x in read_floats(os.path.join(d, "pid.*.*"))]:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    proc.wait()
    shutil.rmtree(d, ignore_errors=True)
    return result


def run_restarts(which: str, nproc: int, n: int, cap: float) -> str:
    d = tempfile.mkdtemp(prefix=f"bench-{which}-r-")
    cmd = launcher_cmd(which, nproc, n, os.path.join(d, "logs"), [RESTARTER, str(n)])
    log = open(os.path.join(d, "out.txt"), "w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "BENCH_DIR": d})
    try:
        proc.wait(timeout=cap)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        orphans = kill_marked(d)  # torchrun's workers outlive it
        shutil.rmtree(d, ignore_errors=True)
        return f"hung at {cap:.0f} s, {orphans} orphans"
    log.seek(0)
    out = log.read()
    kill_marked(d)
    shutil.rmtree(d, ignore_errors=True)
    reached = max([int(x.split("OK attempt=")[1].split()[0]) for x in out.splitlines()
                   if "OK attempt=" in x] or [-1])
    ok = proc.returncode == 0 and reached == n
    return f"{n}/{n} restarts ok" if ok else f"failed (exit {proc.returncode}, last good attempt {reached})"


def kill_marked(bench_dir: str) -> int:
    """SIGKILL every process whose environment has BENCH_DIR=bench_dir; returns how many."""
    pids = proctree.with_env("BENCH_DIR", bench_dir)
    proctree.kill_all(pids)
    return len(pids)


def median_of(results: list[dict]) -> dict:
    """Per key, the median of the runs that measured it (None if fewer than half did)."""
    merged: dict = {}
    for key in {k for r in results for k in r}:
        values = sorted(r[key] for r in results if isinstance(r.get(key), float))
        merged[key] = values[len(values) // 2] if len(values) * 2 >= len(results) else None
    return merged


def fmt(value) -> str:
    return f"{value:.2f} s" if isinstance(value, float) else "none"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--cap", type=float, default=60.0)
    p.add_argument("--restarts", type=int, default=20)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    rows = []
    results = {}
    for which in ("rankguard", "torchrun"):
        kill = median_of([run_fault(which, args.nproc, "kill", 0, args.cap)
                          for _ in range(args.repeat)])
        stop = run_fault(which, args.nproc, "stop", 0, args.cap)
        restart = median_of([run_fault(which, args.nproc, "kill", 1, args.cap)
                             for _ in range(args.repeat)])
        late = median_of([run_fault(which, args.nproc, "kill", 1, args.cap, fault_at=400)
                          for _ in range(args.repeat)])
        restarts = run_restarts(which, 2, args.restarts, max(args.cap, 300))
        results[which] = (kill, stop, restart, restarts, late)
    rg, tr = results["rankguard"], results["torchrun"]
    rows.append(("SIGKILL of rank 1 -> all rank processes gone", rg[0].get("stop_s"), tr[0].get("stop_s")))
    rows.append(("SIGSTOP of rank 1 -> hang verdict", rg[1].get("verdict_s"), tr[1].get("verdict_s")))
    rows.append(("SIGSTOP of rank 1 -> all rank processes gone", rg[1].get("stop_s"), tr[1].get("stop_s")))
    rows.append(("SIGKILL at op 20 -> first all-reduce, restarted", rg[2].get("restart_first_step_s"),
                 tr[2].get("restart_first_step_s")))
    rows.append(("SIGKILL at op 400 -> first all-reduce, restarted", rg[4].get("restart_first_step_s"),
                 tr[4].get("restart_first_step_s")))
    print(f"{args.nproc} ranks, gloo, CPU; cap {args.cap:.0f} s (none = not within the cap)")
    print(f"{'measure':52} {'rankguard':>12} {'torchrun':>12} {'ratio':>8}")
    for name, a, b in rows:
        ratio = f"{b / a:.1f}x" if isinstance(a, float) and isinstance(b, float) and a > 0 else "-"
        print(f"{name:52} {fmt(a):>12} {fmt(b):>12} {ratio:>8}")
    print(f"{'restart success, 2 ranks, ' + str(args.restarts) + ' restarts':52} {rg[3]:>12} {tr[3]:>12}")


if __name__ == "__main__":
    main()
