"""Instrumentation cost per collective, in the same processes: rankguard's group beside plain gloo.

    python bench/overhead_inprocess.py [--ranks 2] [--sizes 4 1048576] [--rounds 31]

Each of ``--ranks`` processes (started here, on one FileStore) forms rankguard's instrumented
default group, and the C++ process group torch builds for "gloo" over the same gloo backend (so
the two differ only in the path from ``dist.all_reduce`` to gloo), then runs paired, interleaved
rounds of ``dist.all_reduce`` on each (the order swapped every round).
Rank 0 prints, per size, the median over rounds of the time per all_reduce on each group and of
their difference, in wall-clock microseconds, in microseconds of the main thread's CPU (it
holds on a loaded machine: the dispatch path costs CPU, waiting does not) and of the other
threads' CPU (gloo's, torch's and the completion sweeper: were the instrumented path to copy or
touch the tensor, or make gloo work harder, it would show here). Then the deterministic part,
what the instrumented op does beyond forwarding to gloo (the ledger entry, which records the
previous op's completion in the same write, and handing the work to the completion tracker),
timed on its own, in a hot loop and right after a short sleep: code that runs after a
collective's wait runs with cold caches, and on a busy machine costs many times its hot figure.

Run by bench/collective_overhead.py's readers to find where a difference comes from; the
completion sweeper runs as under ``rankguard run`` with its default lag.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))


def after_sleep_us(step: Callable[[], object], n: int = 2000) -> float:
    """Median time of ``step`` right after the thread slept (caches and TLB as a collective's
    wait leaves them on a busy machine)."""
    times = []
    for _ in range(n):
        time.sleep(0.0005)
        start = time.perf_counter_ns()
        step()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1000


def other_threads_cpu_ns(main_tid: int) -> int:
    """CPU nanoseconds used so far by this process's threads other than ``main_tid`` (gloo's,
    torch's, rankguard's completion sweeper)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == main_tid:
            continue
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return total


def rank_main(rank: int, world: int, store_path: str, sizes: list[int], rounds: int) -> None:
    import torch
    import torch.distributed as dist
    from plain_group import plain_group_over

    from rankguard.records import ledger
    from rankguard.runtime import instrument, state

    state.current().ledger = ledger.LedgerWriter.private(world)
    instrument.install()
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=dist.PrefixStore("ours", store), rank=rank,
                            world_size=world)
    ours = dist.group.WORLD
    assert type(ours).__name__ == "InstrumentedGroup"
    gloo = ours._get_backend(torch.device("cpu"))  # one backend: only the path to it differs
    plain = plain_group_over(gloo, store, rank, world)

    main_tid = threading.get_native_id()

    def per_op(group: object, t: torch.Tensor, n: int) -> tuple[float, float, float]:
        others = other_threads_cpu_ns(main_tid)
        wall, cpu = time.perf_counter(), time.thread_time()
        for _ in range(n):
            dist.all_reduce(t, group=group)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        others = other_threads_cpu_ns(main_tid) - others
        return wall / n * 1e6, cpu / n * 1e6, others / n / 1e3

    for size in sizes:
        t = torch.ones(max(1, size // 4))
        n = max(20, min(500, (1 << 24) // max(size, 1)))  # a round: about 0.1 s idle
        for group in (plain, ours):
            per_op(group, t, n // 4)
        pairs = []
        for i in range(rounds):
            first, second = (plain, ours) if i % 2 else (ours, plain)
            a, b = per_op(first, t, n), per_op(second, t, n)
            pairs.append((a, b) if first is plain else (b, a))
        if rank == 0:
            med = {key: statistics.median(f(p, o) for p, o in pairs) for key, f in (
                ("plain_us", lambda p, o: p[0]), ("ours_us", lambda p, o: o[0]),
                ("diff_us", lambda p, o: o[0] - p[0]), ("plain_cpu_us", lambda p, o: p[1]),
                ("ours_cpu_us", lambda p, o: o[1]), ("diff_cpu_us", lambda p, o: o[1] - p[1]),
                ("plain_other_us", lambda p, o: p[2]), ("ours_other_us", lambda p, o: o[2]),
                ("diff_other_us", lambda p, o: o[2] - p[2]))}
            print(f"{world:>5} {size:>8} B {n:>6}  wall {med['plain_us']:>9.1f} "
                  f"{med['ours_us']:>9.1f} {med['diff_us']:>+7.1f} us "
                  f"({med['diff_us'] / med['plain_us'] * 100:+.1f}%)"
                  f"   main-thread CPU {med['plain_cpu_us']:>7.1f} {med['ours_cpu_us']:>7.1f}"
                  f" {med['diff_cpu_us']:>+6.1f} us   other threads' CPU "
                  f"{med['plain_other_us']:>7.1f} {med['ours_other_us']:>7.1f}"
                  f" {med['diff_other_us']:>+6.1f} us", flush=True)
    work = gloo.allreduce([torch.ones(1)])  # a completed work, for the steps' timing
    work.wait()
    if rank == 0:
        slot = state.current().ledger.world()
        tracker = state.current().completions

        def started() -> object:
            return work

        def enter_and_track() -> None:  # the previous op's completion folded into the entry
            tracker.issue(slot, 2, started, (), {})  # as the instrumented op calls it

        if not hasattr(tracker, "issue"):  # rankguard before CompletionTracker.issue
            def enter_and_track() -> None:  # noqa: F811
                tracker.enter(slot, 2)
                tracker.add(slot, work)

        tracker.add(slot, work)
        steps = {"ledger entry alone": lambda: slot.enter(2),
                 "entry + tracking": enter_and_track,
                 "an empty call": lambda: None}
        print("instrumentation steps alone, hot (in a loop) and right after a 0.5 ms sleep (as "
              "after a collective's wait):", flush=True)
        for name, step in steps.items():
            n = 200_000
            hot = timeit.timeit(step, number=n) / n * 1e6
            print(f"  {name:20} hot {hot:6.3f} us   after a sleep {after_sleep_us(step):6.2f} us",
                  flush=True)
    state.current().completions.close()
    os._exit(0)  # no destroy: the groups' teardown is not what is measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 1048576])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.ranks, args.store, args.sizes, args.rounds)
        return
    print(f"{'ranks':>5} {'size':>10} {'iters':>6}  {'':4} {'plain':>9} {'rankguard':>9} "
          f"{'diff':>7}   (medians of {args.rounds} paired rounds)")
    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = [subprocess.Popen([sys.executable, __file__, "--ranks", str(args.ranks),
                                   "--rounds", str(args.rounds), "--sizes",
                                   *map(str, args.sizes), "--rank", str(rank), "--store", store],
                                  env=env) for rank in range(args.ranks)]
        codes = [proc.wait(timeout=600) for proc in procs]
    if any(codes):
        sys.exit(f"a rank failed: exit codes {codes}")


if __name__ == "__main__":
    main()
