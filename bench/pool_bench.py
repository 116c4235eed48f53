"""rankguard.Pool against a plain gloo group served the way a team writes it by hand.

    python bench/pool_bench.py [--requests 200] [--forward-ms 10] [--world 2] [--faults 5]

1. Latency and throughput of one request at a time, the same forward (about --forward-ms of
   matmuls, then an all_reduce) on both:
   - plain: N processes with a plain gloo group (no rankguard), a leader that sends each
     request through a multiprocessing Pipe to every rank and reads rank 0's answer;
   - rankguard: ``rankguard.Pool(N).run(forward, ...)`` (bounded collectives, ledgers, fault
     verdicts).
   Rounds alternate between the two, and the medians are compared.
2. Recovery: a rank is SIGKILLed mid-forward; the time from that request's start to the first
   successful request after it, with one warm spare group and with none (the killed rank is
   replaced in its group, forked from the zygote; the other ranks are kept). The plain group
   has no recovery of its own (gloo fails the survivor's all_reduce;
   the daemon is left without a group); the figure beside it is a cold start of a new plain
   group, what restarting the daemon costs at best.
3. Fault to error: each kind of fault mid-forward, the time until the call raises, against its
   deadline.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rankguard  # noqa: E402

import pool_bench_functions as fns  # noqa: E402
from plain_served import PlainGroup  # noqa: E402


def timed(run: Any, fn: Any, *args: Any) -> float:
    started = time.perf_counter()
    run(fn, *args)
    return time.perf_counter() - started


def latency(args: argparse.Namespace, work: int) -> None:
    plain = PlainGroup(args.world)
    pool = rankguard.Pool(args.world, fns.setup, spares=0, timeout=30)
    try:
        for _ in range(10):  # warm both
            plain.run(fns.forward, work)
            pool.run(fns.forward, work)
        times: dict[str, list[float]] = {"plain": [], "rankguard": []}
        wall = {"plain": 0.0, "rankguard": 0.0}
        for i in range(args.requests):
            order = [("plain", plain.run), ("rankguard", pool.run)]
            for name, run in order if i % 2 == 0 else order[::-1]:
                took = timed(run, fns.forward, work)
                times[name].append(took)
                wall[name] += took
    finally:
        plain.close()
        pool.close()
    med = {name: statistics.median(values) for name, values in times.items()}
    p99 = {name: sorted(values)[int(len(values) * 0.99) - 1] for name, values in times.items()}
    print(f"\n1. one request at a time, {args.requests} rounds each, {args.world} ranks, "
          f"forward of about {args.forward_ms:g} ms + all_reduce")
    print(f"{'':28}{'median':>10}{'p99':>10}{'req/s':>10}")
    for name in ("plain", "rankguard"):
        print(f"{name:28}{med[name] * 1e3:>8.2f}ms{p99[name] * 1e3:>8.2f}ms"
              f"{len(times[name]) / wall[name]:>10.1f}")
    overhead = med["rankguard"] / med["plain"] - 1
    print(f"rankguard / plain, median latency: {1 + overhead:.3f} ({overhead * 100:+.1f}%, "
          f"{(med['rankguard'] - med['plain']) * 1e3:+.2f} ms per request)")


def recovery(args: argparse.Namespace, work: int) -> None:
    print(f"\n2. fault -> first successful request after it ({args.world} ranks, rank 1 "
          f"SIGKILLed mid-forward), {args.faults} faults each")
    figures = {}
    for spares in (1, 0):
        pool = rankguard.Pool(args.world, fns.setup, spares=spares, timeout=60)
        took = []
        try:
            for _ in range(args.faults):
                deadline = time.monotonic() + 120
                while pool.status().spares_ready < spares and time.monotonic() < deadline:
                    time.sleep(0.05)
                started = time.perf_counter()
                try:
                    pool.run(fns.forward, work, "kill:rank=1")
                except rankguard.RequestFailed:
                    pass
                pool.run(fns.forward, work)
                took.append(time.perf_counter() - started)
        finally:
            pool.close()
        figures[spares] = statistics.median(took)
    started = time.perf_counter()
    plain = PlainGroup(args.world)
    plain.run(fns.forward, work)
    cold_plain = time.perf_counter() - started
    plain.close()
    print(f"{'rankguard, 1 warm spare group':40}{figures[1]:>8.3f} s (median)")
    print(f"{'rankguard, no spare (rank 1 replaced)':40}{figures[0]:>8.3f} s (median)")
    print(f"{'plain: no recovery; a new plain group':40}{cold_plain:>8.3f} s "
          "(gloo fails the survivor's all_reduce; nothing restarts the group)")
    print(f"warm spare vs rank replacement: {figures[0] / figures[1]:.1f}x faster")


def fault_to_error(args: argparse.Namespace, work: int) -> None:
    timeout = 1.0
    print(f"\n3. fault mid-forward -> the call's error (deadline {timeout:g} s, rank 1 faulty, "
          "one warm spare)")
    print(f"{'fault':18}{'cause':>12}{'error after':>14}{'past deadline':>16}")
    pool = rankguard.Pool(args.world, fns.setup, spares=1, timeout=timeout)
    try:
        for fault in ("raise:rank=1", "crash:3:rank=1", "kill:rank=1", "stop:rank=1",
                      "hang:rank=1", "gil:rank=1"):
            deadline = time.monotonic() + 120
            while pool.status().spares_ready < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            started = time.perf_counter()
            try:
                pool.run(fns.forward, work, fault)
                cause = "none"
            except rankguard.RequestFailed as error:
                cause = error.cause
            took = time.perf_counter() - started
            past = f"{(took - timeout) * 1e3:+.0f} ms" if took > timeout else "-"
            print(f"{fault:18}{cause:>12}{took * 1e3:>12.0f}ms{past:>16}")
    finally:
        pool.close()
    print("plain gloo group: a rank that freezes, hangs or spins leaves its peer blocked in "
          "all_reduce for gloo's timeout (30 min by default); one that dies makes gloo fail the "
          "peer, naming no rank; an exception leaves the peer blocked")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--forward-ms", type=float, default=10.0)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--faults", type=int, default=5)
    args = parser.parse_args()
    work = fns.calibrate(args.forward_ms / 1e3)
    print(f"forward: {work} matmuls of 128x128 (about {args.forward_ms:g} ms on one core)")
    latency(args, work)
    recovery(args, work)
    fault_to_error(args, work)


if __name__ == "__main__":
    main()
