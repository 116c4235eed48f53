"""Per-collective cost of running a plain script under ``rankguard run`` instead of torchrun.

    python bench/collective_overhead.py                       # 2 and 4 ranks, 4 B and 1 MB, 5 runs
    python bench/collective_overhead.py --ranks 2 --sizes 1048576 --repeats 9
    python bench/collective_overhead.py --rankguard-arg=--collective-timeout=60   # bounded mode
    python bench/collective_overhead.py --pin --repeats 9     # ranks pinned: less noise
    python bench/collective_overhead.py --backend nccl --ranks 2 8 --sizes 4096   # one GPU
    python bench/collective_overhead.py --backend nccl --rankguard-env TORCH_NCCL_ENABLE_TIMING=0

NCCL (``--backend nccl``): every rank on GPU 0, a host of its own through ``NCCL_HOSTID`` and
NCCL's socket transport on loopback, so that one GPU serves any number of ranks; rankguard
leaves NCCL groups as torch makes them and reads their progress on a thread of its own, so the
main thread's CPU per all_reduce is what rankguard's settings (``TORCH_NCCL_ENABLE_TIMING=1``)
cost there.

One script, bench/collective_worker.py (plain torch.distributed, no rankguard import), times N
all_reduces of each size after a warm-up (N: as many as fill ``--loop-seconds`` on the machine at
hand, from rank 0's warm-up, or ``--iters``). It is run ALTERNATELY under ``python -m
rankguard.cli run`` and ``python -m torch.distributed.run --standalone`` (``--repeats`` times
each, the order swapped every round), all sizes in each run; the figures are medians over the
runs, printed side by side with torchrun's as microseconds per all_reduce and as a ratio, with
a 95% interval of the difference over the runs (as a share of torchrun's time): a ratio whose
interval spans 0 is within run-to-run noise. ``--pin`` has each rank pin itself to one core
(the worker does it, by local rank, before torch starts its threads, under both launchers
alike): on a 2-core machine it takes out most of that noise, which comes from where the
scheduler happens to put the ranks' threads.

Then the CPU, the figure that shows where the time goes even on a loaded machine (wall-clock
figures on a shared 2-core machine are noise; CPU time is far less sensitive): during the timed
loops, the launcher's own CPU (every thread, ``/proc/PID/task/*/schedstat``) and the guardian's,
beside torchrun's agent, as CPU seconds per minute of loop (0.6 s/min is 1% of one core); and
each rank's threads, read by the rank itself at both ends of each loop and named: ``main`` (as
microseconds of CPU per all_reduce), ``native`` (gloo's and torch's own threads) and rankguard's
(``rankguard-completions``, ``rankguard-sigterm``, ``rankguard-responder``). The native
threads' CPU per all_reduce varies from run to run by far more than from launcher to launcher
(gloo's TCP loop thread alone: 330 to 1100 us per 1 MB all_reduce, under either launcher, as
the two ranks' threads happen to share or not share cores), so its difference is printed with
a 95% interval over the runs: a difference inside it is not rankguard's.

At the defaults it starts 20 jobs, each with two timed loops of about a second: about 3 minutes
on an idle 2-core machine (most of it is starting Python and torch).
"""
from __future__ import annotations

import argparse
import os
import json
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "collective_worker.py")
LAUNCHERS = ("torchrun", "rankguard")
_RESULT = "RGBENCH {"
_MARK = re.compile(r"RGBENCH-(BEGIN|END) (\d+)")


def process_cpu_s(pid: int) -> float:
    """CPU seconds used so far by every live thread of ``pid`` (0.0 when it is gone)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError):
            continue
    return total / 1e9


@dataclass
class Run:
    """One job under one launcher: the ranks' results and the supervisors' CPU per loop."""

    launcher: str
    nproc: int
    results: dict[int, list[dict]] = field(default_factory=lambda: defaultdict(list))
    # per size: (loop seconds seen by the bench, launcher CPU s, guardian CPU s)
    supervisor: dict[int, tuple[float, float, float]] = field(default_factory=dict)


def command(launcher: str, nproc: int, log_dir: str, extra: list[str],
            loops: list[str]) -> list[str]:
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}"]
    else:
        cmd = [sys.executable, "-m", "rankguard.cli", "run", "--master-port", "0",
               "--nproc-per-node", str(nproc), "--log-dir", log_dir, *extra]
    return [*cmd, WORKER, *loops]


def guardian_of(pid: int) -> int | None:
    try:
        for child in psutil.Process(pid).children():
            if "rankguard.launcher.guardian" in " ".join(child.cmdline()):
                return child.pid
    except psutil.Error:
        pass
    return None


# several NCCL ranks on one GPU: NCCL's socket transport on loopback only
ONE_GPU = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1",
           "NCCL_NVLS_ENABLE": "0", "NCCL_COLLNET_ENABLE": "0", "NCCL_SOCKET_IFNAME": "lo"}


def run_once(launcher: str, nproc: int, loops: list[str], extra: list[str],
             pin: bool = False, backend: str = "gloo",
             rankguard_env: dict[str, str] | None = None) -> Run:
    """Run the worker once under ``launcher``; ``loops``: its arguments; ``pin``: each rank
    pins itself to one core; ``rankguard_env``: more environment under rankguard only."""
    log_dir = tempfile.mkdtemp(prefix="rankguard-bench-")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "RGBENCH_BACKEND": backend}
    if backend == "nccl":
        env.update(ONE_GPU)
    if launcher == "rankguard":
        env.update(rankguard_env or {})
    if pin:
        env["RGBENCH_PIN"] = "1"
    proc = subprocess.Popen(command(launcher, nproc, os.path.join(log_dir, "logs"), extra, loops),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    run = Run(launcher, nproc)
    lines: list[str] = []
    guardian: int | None = None
    began: tuple[float, float, float] | None = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            mark = _MARK.search(line)
            if mark:
                if launcher == "rankguard" and guardian is None:
                    guardian = guardian_of(proc.pid)
                now = (time.monotonic(), process_cpu_s(proc.pid),
                       process_cpu_s(guardian) if guardian else 0.0)
                if mark.group(1) == "BEGIN":
                    began = now
                elif began is not None:
                    run.supervisor[int(mark.group(2))] = tuple(b - a for a, b in zip(began, now))
                continue
            found = line.find(_RESULT)
            if found >= 0:
                result = json.JSONDecoder().raw_decode(line, found + len(_RESULT) - 1)[0]
                # NCCL groups are left as torch makes them, and keep their backend's name
                wrapped = (launcher == "rankguard" and backend == "gloo"
                           and (rankguard_env or {}).get("RANKGUARD_GLOO") != "recorder")
                expected = "InstrumentedGroup" if wrapped else "ProcessGroup"
                assert result["group"] == expected, (launcher, result["group"])
                assert result["backend"] == backend, (launcher, result["backend"])
                run.results[result["size"]].append(result)
        code = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(log_dir, ignore_errors=True)
    if code != 0 or len(run.supervisor) != len(loops) - 1:
        sys.exit(f"{launcher} exited {code}; its output:\n" + "".join(lines[-40:]))
    return run


def machine_busy(seconds: float = 1.0) -> float:
    """The share of the machine's CPU time that was not idle over the next ``seconds``."""
    def times() -> list[int]:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    before = times()
    time.sleep(seconds)  # a measurement window, not a wait for anything
    spent = [b - a for a, b in zip(before, times())]
    idle = spent[3] + spent[4]  # idle, iowait
    return 1.0 - idle / max(sum(spent), 1)


def size_label(size: int) -> str:
    return f"{size // 1048576} MB" if size >= 1048576 else f"{size} B"


def _per_run(runs: list[Run], size: int, value: Callable[[dict], float],
             rank0: bool = False) -> list[float]:
    """For each of ``runs``, ``value`` of a rank's result for ``size`` (rank 0's, or the mean
    over the ranks)."""
    return [statistics.mean(value(x) for x in r.results[size] if x["rank"] == 0 or not rank0)
            for r in runs]


def _median_over_runs(runs: list[Run], size: int, value: Callable[[dict], float],
                      rank0: bool = False) -> float:
    """The median over ``runs`` of :func:`_per_run`."""
    return statistics.median(_per_run(runs, size, value, rank0))


def median_difference_interval(a: list[float], b: list[float],
                               resamples: int = 2000) -> tuple[float, float]:
    """A 95% interval of median(b) - median(a), by resampling the runs (seeded, so the same
    runs give the same interval): a difference inside it is run-to-run noise."""
    rng = random.Random(0)
    diffs = sorted(statistics.median(rng.choices(b, k=len(b)))
                   - statistics.median(rng.choices(a, k=len(a))) for _ in range(resamples))
    return diffs[int(resamples * 0.025)], diffs[int(resamples * 0.975) - 1]


def report(runs: list[Run], nproc: int, sizes: list[int]) -> None:
    """Per size: wall-clock time per all_reduce under each launcher, and the CPU per all_reduce
    of each rank's main thread and of its native (gloo, torch) threads."""
    by = {name: [r for r in runs if r.launcher == name and r.nproc == nproc] for name in LAUNCHERS}

    def per_op(thread: str) -> Callable[[dict], float]:
        return lambda x: x["threads"].get(thread, 0.0) / x["iters"] * 1e6

    for size in sizes:
        walls = {name: _per_run(by[name], size, lambda x: x["us_per_op"], rank0=True)
                 for name in LAUNCHERS}
        us = {name: statistics.median(walls[name]) for name in LAUNCHERS}
        wall_low, wall_high = median_difference_interval(walls["torchrun"], walls["rankguard"])
        main = {name: _median_over_runs(by[name], size, per_op("main")) for name in LAUNCHERS}
        native = {name: _per_run(by[name], size, per_op("native")) for name in LAUNCHERS}
        diff, ratio = us["rankguard"] - us["torchrun"], us["rankguard"] / us["torchrun"]
        extra = main["rankguard"] - main["torchrun"]
        low, high = median_difference_interval(native["torchrun"], native["rankguard"])
        noise = f"{wall_low / us['torchrun']:+.1%} to {wall_high / us['torchrun']:+.1%}"
        print(f"{nproc:>5} {size_label(size):>6} {us['torchrun']:>11.1f} us "
              f"{us['rankguard']:>11.1f} us {diff:>+9.1f} us {ratio:>7.3f} {noise:>17}   | "
              f"{main['torchrun']:>17.1f} {main['rankguard']:>9.1f} ({extra:+.1f})"
              f" {statistics.median(native['torchrun']):>9.1f}"
              f" {statistics.median(native['rankguard']):>9.1f}"
              f" (95%: {low:+.0f} to {high:+.0f})")
        if any(x.get("backend") == "nccl" for r in runs for x in r.results[size]):
            issue = {name: _per_run(by[name], size, lambda x: x["issue_us_per_op"])
                     for name in LAUNCHERS}
            low, high = median_difference_interval(issue["torchrun"], issue["rankguard"])
            mid = {name: statistics.median(issue[name]) for name in LAUNCHERS}
            print(f"{'':>13} NCCL: the main thread's time to issue (enqueue) one all_reduce: "
                  f"torchrun {mid['torchrun']:.2f} us, rankguard {mid['rankguard']:.2f} us "
                  f"({mid['rankguard'] - mid['torchrun']:+.2f} us; 95% of the difference: "
                  f"{low:+.2f} to {high:+.2f})")


def cpu_report(runs: list[Run], nproc: int) -> None:
    """Seconds of CPU per minute of timed loop: the supervisors', and each of rankguard's threads
    in a rank."""
    rows: dict[str, dict[str, float]] = defaultdict(dict)
    for name in LAUNCHERS:
        mine = [r for r in runs if r.launcher == name and r.nproc == nproc]
        wall = sum(s[0] for r in mine for s in r.supervisor.values())
        rows["launcher (torchrun: its agent)"][name] = sum(
            s[1] for r in mine for s in r.supervisor.values()) / wall * 60
        if name == "rankguard":
            rows["guardian"][name] = sum(
                s[2] for r in mine for s in r.supervisor.values()) / wall * 60
        loop_wall = sum(x["wall_s"] for r in mine for res in r.results.values() for x in res)
        threads: dict[str, float] = defaultdict(float)
        for r in mine:
            for res in r.results.values():
                for x in res:
                    for thread, cpu in x["threads"].items():
                        threads[thread] += cpu
        for thread, cpu in sorted(threads.items()):
            if thread not in ("main", "native"):  # those are per all_reduce, above
                rows[f"each rank: {thread}"][name] = cpu / loop_wall * 60  # walls add up
    print(f"{nproc:>5} ranks, CPU s per minute of loop (0.6 = 1% of a core) "
          f"{'torchrun':>10} {'rankguard':>10}")
    for label, values in rows.items():
        cells = [f"{values[n]:>10.3f}" if n in values else f"{'-':>10}" for n in LAUNCHERS]
        print(f"      {label:<47} {' '.join(cells)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 1048576],
                        help="all_reduce sizes in bytes (multiples of 4)")
    parser.add_argument("--loop-seconds", type=float, default=1.0,
                        help="how long each timed loop lasts (N is derived from the warm-up)")
    parser.add_argument("--iters", type=int, default=None,
                        help="all_reduces per timed loop, instead of --loop-seconds")
    parser.add_argument("--repeats", type=int, default=5, help="runs under each launcher")
    parser.add_argument("--rankguard-arg", action="append", default=[],
                        help="an extra option for rankguard run (repeatable)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                        help="nccl: every rank on GPU 0 (see the module doc)")
    parser.add_argument("--rankguard-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the ranks under rankguard only "
                             "(repeatable), e.g. TORCH_NCCL_ENABLE_TIMING=0")
    parser.add_argument("--pin", action="store_true",
                        help="each rank pins itself to one core (by local rank, wrapping "
                             "around), under both launchers alike")
    args = parser.parse_args()
    rankguard_env = dict(item.partition("=")[::2] for item in args.rankguard_env)
    loops = [str(args.loop_seconds),
             *(f"{size}:{args.iters}" if args.iters else str(size) for size in args.sizes)]
    busy = machine_busy()
    started = time.monotonic()
    runs = []
    for nproc in args.ranks:
        for round_ in range(args.repeats):
            for launcher in (LAUNCHERS if round_ % 2 else LAUNCHERS[::-1]):
                runs.append(run_once(launcher, nproc, loops, args.rankguard_arg, args.pin,
                                     args.backend, rankguard_env))
    counts = sorted({x["iters"] for r in runs for res in r.results.values() for x in res})
    settings = " ".join(args.rankguard_env)
    print(f"{args.backend} all_reduce, {args.repeats} runs under each launcher alternated, "
          f"medians{f' (rankguard with {settings})' if settings else ''}; "
          f"{counts[0]} to {counts[-1]} all_reduces per timed loop")
    print(f"{'':>73}   | CPU us per all_reduce and rank (robust to load)")
    print(f"{'ranks':>5} {'size':>6} {'torchrun':>14} {'rankguard':>14} {'difference':>12} "
          f"{'ratio':>7} {'(95% of ratio-1)':>17}   | main thread: torchrun rankguard (diff)  gloo+torch threads "
          "(the difference's run-to-run noise)")
    for nproc in args.ranks:
        report(runs, nproc, args.sizes)
    print()
    for nproc in args.ranks:
        cpu_report(runs, nproc)
    print(f"\ntook {time.monotonic() - started:.0f} s; the machine was {busy:.0%} busy before "
          "the first job" + (" (others are using it: wall-clock figures are noise, CPU figures "
                             "still hold)" if busy > 0.1 else ""))

if __name__ == "__main__":
    main()
