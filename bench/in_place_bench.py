"""Recovery inside the job vs restarting it: one rank of a DDP job SIGKILLed mid-training.

    python bench/in_place_bench.py [--nproc 4] [--steps 2000] [--warm 8] [--cap 180]
    python bench/in_place_bench.py --overhead 5 [--steps 800]
    python bench/in_place_bench.py --paired [--steps 2000]
    python bench/in_place_bench.py --device cuda [--nproc 2]

The job is ``in_place_worker.py`` (a 3-layer MLP, DDP on gloo/CPU). For each way of recovering,
the bench starts the job, waits until it has run ``--warm`` seconds past its first step (so
rankguard's warm spares have imported torch), SIGKILLs rank 1 and records when, and reads rank
0's log of completed steps. Printed side by side, from one run:

- **fault -> next step**: from the SIGKILL to the first step that rank 1's new process completes
  (a replacement, or the restarted rank);
- **rank 0 paused**: the longest time between two of rank 0's completed steps from the fault
  on (what the survivors lose);
- **steps lost**: steps that had completed before the fault and were computed again after it
  (the restarts resume from a checkpoint taken every 20 steps); "N w/o it": steps the others
  completed without rank 1 (torchft goes on with fewer replicas);
- **same parameters**: whether the final parameters equal, bit for bit, those of the same
  recovery's job run without the fault;
- **step time** without faults: the median time between steps, and its ratio to the plain DDP
  script under torchrun (the cost of StepLoop, its communication hook and bounded mode).

Ways: (a) ``rankguard run --recovery in-place`` with ``rankguard.StepLoop``; (b) ``rankguard
run`` restarting (warm spares); (c) ``torchrun`` restarting; (d) torchft, when it is installed
(``pip install torchft``): four replica groups of one rank, each under a torchrun that restarts
it, with torchft's lighthouse in this process on loopback (torchft's own servers listen on
every interface).

``--device cuda`` trains on GPU 0 over NCCL, every rank sharing it (each a host of its own
through ``NCCL_HOSTID``; NCCL over its socket transport on loopback), without torchft. Below the
table, the in-place recovery's parts from its journal: detection (the SIGKILL to the launcher's
``replace``), the replacement's start to holding the state (process, CUDA, joining the new
generation: its communicator), the state transfer (``share_s``), and the rest to its first step.

Each run's figures are printed as it ends, way by way, the in-place one first; interrupted
(SIGINT), the bench kills the run under way and prints the table of the ways whose runs ended.

``--overhead ROUNDS`` measures only the step time without faults, which one run cannot tell
from noise: ROUNDS rounds, each running the three ways back to back in a rotating order, (a)
as above, (b) and (c) the plain DDP loop (no checkpoints). It prints each way's median step
time over the rounds, and the median and range of its ratio to torchrun within a round.
rankguard keeps no warm spares there: their start-up (5 s of CPU each) would share this
machine's two cores with the steps being timed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from rankguard.processes import proctree

from bench_devices import SHARED_GPU_NCCL

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "in_place_worker.py")
NAMES = {"in-place": "rankguard in-place", "rankguard-restart": "rankguard restart",
         "torchrun": "torchrun restart", "torchft": "torchft heal"}
ONE_GPU = {"BENCH_DEVICE": "cuda", **SHARED_GPU_NCCL}  # every rank on GPU 0


def command(way: str, nproc: int, steps: int, out: str, mode: str, spares: bool = True
            ) -> list[str]:
    job = [WORKER, mode, str(steps), out]
    if way == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={nproc}", "--max-restarts=1", *job]
    extra = (["--recovery", "in-place"] if way == "in-place" else []) + \
        ([] if spares else ["--no-spares"])
    return [sys.executable, "-m", "rankguard.cli", "run", "--master-port", "0", "--no-tee",
            "--nproc-per-node", str(nproc), "--max-restarts", "3", "--hang-timeout", "3",
            "--log-dir", os.path.join(out, "logs"), *extra, *job]


def steps_of(out: str, rank: int = 0) -> list[dict]:
    path = os.path.join(out, f"steps_rank{rank}.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def rank_pid(tag: str, way: str, rank: int) -> int | None:
    """The live process of rank ``rank`` of the run tagged ``tag`` (with torchft, the worker
    of replica group ``rank``, not the torchrun that restarts it)."""
    of_run = set(proctree.with_env("BENCH_TAG", tag))
    if way == "torchft":
        of_run &= set(proctree.with_env("BENCH_REPLICA", str(rank)))
        rank = 0  # each replica group has one rank
    return next((pid for pid in proctree.with_env("RANK", str(rank)) if pid in of_run), None)


def start(way: str, nproc: int, steps: int, out: str, mode: str, tag: str, spares: bool
          ) -> tuple[list[subprocess.Popen], subprocess.Popen | None]:
    """The job's processes, and torchft's lighthouse (None for the other ways). torchft runs
    as its README shows: a lighthouse (``--min_replicas 1 --quorum_tick_ms 100
    --join_timeout_ms 10000``) and one torchrun per replica group, here of one rank each."""
    quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL,
                             "start_new_session": True}
    env = {**os.environ, "BENCH_TAG": tag}
    if way != "torchft":
        return [subprocess.Popen(command(way, nproc, steps, out, mode, spares), env=env,
                                 **quiet)], None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    lighthouse = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse"), "--bind",
         f"127.0.0.1:{port}", "--min_replicas", "1", "--quorum_tick_ms", "100",
         "--join_timeout_ms", "10000"], env=env, **quiet)
    limit = time.monotonic() + 10
    while time.monotonic() < limit:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    job = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
           "--max-restarts=1", WORKER, "torchft", str(steps), out]
    return [subprocess.Popen(job, env={**env, "BENCH_REPLICA": str(group),
                                       "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}"}, **quiet)
            for group in range(nproc)], lighthouse


def run(way: str, nproc: int, steps: int, warm: float, cap: float, fault: bool,
        baseline: str = "checkpoint", spares: bool = True, mode: str | None = None) -> dict:
    """One job of ``way``: the in-place way runs StepLoop, the others ``baseline`` (``mode``:
    the worker's mode, whatever the way); without ``spares``, rankguard keeps no warm spare
    (whose start-up would share the cores with the steps being timed)."""
    out = tempfile.mkdtemp(prefix=f"rg-inplace-{way}-")
    tag = os.path.basename(out)
    if mode is None:
        mode = "step-loop" if way == "in-place" else "torchft" if way == "torchft" \
            else baseline
    procs, lighthouse = start(way, nproc, steps, out, mode, tag, spares)
    deadline = time.monotonic() + cap
    t_fault = killed = None
    capped = False
    try:
        if fault:  # (a job whose processes all ended takes no step: no fault then)
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                done = steps_of(out)
                if done and time.time() - done[0]["t"] > warm:
                    break
                time.sleep(0.05)
            killed = rank_pid(tag, way, 1)
            if killed is not None:
                t_fault = time.time()
                os.kill(killed, signal.SIGKILL)
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as stopped:
        capped = True
        for proc in procs:
            proctree.signal_tree(proc.pid, signal.SIGKILL)
            proc.wait()
        if isinstance(stopped, KeyboardInterrupt):  # the job's processes killed first
            proctree.kill_all(proctree.with_env("BENCH_TAG", tag))
            shutil.rmtree(out, ignore_errors=True)
            raise
    finally:
        if lighthouse is not None:
            lighthouse.kill()
            lighthouse.wait()
    # torchrun's workers have sessions of their own, and a failed restart leaves them behind
    proctree.kill_all(proctree.with_env("BENCH_TAG", tag))
    log = steps_of(out)
    checksum = open(os.path.join(out, "checksum")).read() if os.path.exists(
        os.path.join(out, "checksum")) else None
    codes = [proc.returncode for proc in procs]
    result: dict = {"code": next((c for c in codes if c), codes[0]), "checksum": checksum,
                    "capped": cap if capped else None}
    if t_fault is not None:
        # the first step after the fault that the new rank 1 took part in
        before = [e for e in log if e["t"] <= t_fault]
        after = [e for e in steps_of(out, 1) if e["pid"] != killed]
        if before and after:
            result["next_step_s"] = after[0]["t"] - t_fault
            behind = before[-1]["step"] + 1 - after[0]["step"]
            result["lost"], result["without"] = max(0, behind), max(0, -behind)
        since = [t_fault] + [e["t"] for e in log if e["t"] > t_fault]
        result["paused_s"] = max((b - a for a, b in zip(since, since[1:])), default=None)
    times = [e["t"] for e in log]
    gaps = [b - a for a, b in zip(times, times[1:])]
    if not fault and len(gaps) > 20:
        middle = gaps[len(gaps) // 5: -len(gaps) // 5]
        result["step_s"] = statistics.median(middle)
    if os.path.exists(os.path.join(out, "paired.json")):
        with open(os.path.join(out, "paired.json")) as f:
            result["paired"] = json.load(f)
    if t_fault is not None and "next_step_s" in result:
        result["parts"] = in_place_parts(os.path.join(out, "logs", "journal.jsonl"), t_fault,
                                         result["next_step_s"])
    shutil.rmtree(out, ignore_errors=True)
    return result


def in_place_parts(journal_path: str, t_fault: float, next_step_s: float) -> dict | None:
    """Where an in-place recovery's time went, from its journal (None: not one)."""
    if not os.path.exists(journal_path):
        return None
    with open(journal_path) as f:
        events = [json.loads(line) for line in f if line.strip()]
    replace = next((e for e in events if e["event"] == "replace"), None)
    replaced = next((e for e in events if e["event"] == "replaced"), None)
    if replace is None or replaced is None:
        return None
    held = replaced["held_at"]  # when the replacement held the state (its own clock)
    return {"detection": replace["ts"] - t_fault,
            "start, CUDA, new generation": held - replaced["share_s"] - replace["ts"],
            "state transfer": replaced["share_s"],
            "to the first step": t_fault + next_step_s - held}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warm", type=float, default=8.0)
    parser.add_argument("--cap", type=float, default=180.0)
    parser.add_argument("--overhead", type=int, metavar="ROUNDS", default=0,
                        help="measure only the step time without faults, in ROUNDS rounds")
    parser.add_argument("--paired", action="store_true",
                        help="measure StepLoop's cost against the plain loop in the same "
                        "processes, with 1 rank and with --nproc ranks")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: every rank on GPU 0, over NCCL (no torchft)")
    args = parser.parse_args()
    ways: tuple[str, ...] = ("in-place", "rankguard-restart", "torchrun")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("in_place_bench: --device cuda: no CUDA device is visible (leave "
                             "out --device to train on the CPU, or run where one is)")
        os.environ.update(ONE_GPU)  # every job's processes inherit it
    elif importlib.util.find_spec("torchft") is not None:
        ways += ("torchft",)
    if args.paired:
        paired(args.nproc, args.steps, args.cap)
        return
    if args.overhead > 0:
        overhead(ways, args.nproc, args.steps, args.cap, args.overhead)
        return
    clean: dict[str, dict] = {}
    faulty: dict[str, dict] = {}
    try:  # way by way, the first (in-place) first: a run cut short still has its figures
        for way in ways:
            for fault, results in ((False, clean), (True, faulty)):
                results[way] = run(way, args.nproc, args.steps, args.warm, args.cap, fault)
                print(f"{NAMES[way]}, {'SIGKILL of rank 1' if fault else 'no fault'}: "
                      f"{results[way]}", flush=True)
    except KeyboardInterrupt:
        print("in_place_bench: interrupted; the table has the ways whose runs ended")
    ways = tuple(way for way in ways if way in faulty)
    base = clean.get("torchrun", {}).get("step_s")
    print(f"{args.nproc} ranks, {args.steps} steps, SIGKILL of rank 1 {args.warm:g} s after "
          "the first step; one run each")
    print(f"{'':22}{'fault -> next step':>20}{'rank 0 paused':>15}{'steps lost':>14}"
          f"{'same params':>13}{'step time':>11}{'vs torchrun':>13}")
    for way in ways:
        f, c = faulty[way], clean[way]
        next_s = f"{f['next_step_s']:.2f} s" if "next_step_s" in f else \
            f"over --cap {f['capped']:.0f} s" if f["capped"] else f"none (exit {f['code']})"
        paused = f"{f['paused_s']:.2f} s" if f.get("paused_s") is not None else "-"
        lost = str(f["lost"]) if "lost" in f else "-"
        if f.get("without"):
            lost += f" ({f['without']} w/o it)"
        same = "yes" if f["checksum"] and f["checksum"] == c["checksum"] else "no"
        step = f"{c['step_s'] * 1000:.2f} ms" if "step_s" in c else "-"
        ratio = f"{c['step_s'] / base:.3f}" if base and "step_s" in c else "-"
        print(f"{NAMES[way]:22}{next_s:>20}{paused:>15}{lost:>14}{same:>13}{step:>11}"
              f"{ratio:>13}")
    parts = faulty.get("in-place", {}).get("parts")
    if parts:
        print("in-place, fault -> next step: " + ", ".join(f"{name} {seconds:.2f} s"
                                                           for name, seconds in parts.items()))


def overhead(ways: tuple[str, ...], nproc: int, steps: int, cap: float, rounds: int) -> None:
    step_s: dict[str, list[float]] = {way: [] for way in ways}
    ratios: dict[str, list[float]] = {way: [] for way in ways}
    for n in range(rounds):
        order = ways[n % len(ways):] + ways[:n % len(ways)]
        measured = {way: run(way, nproc, steps, 0.0, cap, False, "plain", spares=False)
                    .get("step_s") for way in order}
        base = measured["torchrun"]
        for way in ways:
            if measured[way] is not None:
                step_s[way].append(measured[way])
                if base:
                    ratios[way].append(measured[way] / base)
    print(f"{nproc} ranks, {steps} steps a run, no fault, no warm spares; {rounds} rounds of "
          "the ways back to back in a rotating order; (b) and (c) run the plain DDP loop")
    print(f"{'':22}{'runs':>6}{'median step':>13}{'vs torchrun: median':>21}{'range':>17}")
    names = {**NAMES, "rankguard-restart": "rankguard (plain)", "torchrun": "torchrun (plain)"}
    for way in ways:
        times, r = step_s[way], sorted(ratios[way])
        median = f"{statistics.median(times) * 1000:.2f} ms" if times else "-"
        ratio = f"{statistics.median(r):.3f}" if r else "-"
        spread = f"{r[0]:.3f}..{r[-1]:.3f}" if r else "-"
        print(f"{names[way]:22}{len(times):>6}{median:>13}{ratio:>21}{spread:>17}")


def paired(nproc: int, steps: int, cap: float) -> None:
    print(f"StepLoop's step against the plain DDP loop's, alternating in the same processes "
          f"(rankguard run --recovery in-place, no spares), {steps} steps; medians of rank 0")
    print(f"{'ranks':>6}{'plain loop':>13}{'StepLoop':>11}{'added':>11}{'ratio':>8}")
    for ranks in sorted({1, nproc}):
        result = run("in-place", ranks, steps, 0.0, cap, False, spares=False, mode="paired")
        times = result.get("paired")
        if times is None:
            print(f"{ranks:>6}  no figures (the job exited {result['code']})")
            continue
        plain, looped = times["plain_s"], times["step_loop_s"]
        print(f"{ranks:>6}{plain * 1e3:>10.3f} ms{looped * 1e3:>8.3f} ms"
              f"{(looped - plain) * 1e6:>8.0f} us{looped / plain:>8.3f}")


if __name__ == "__main__":
    main()
