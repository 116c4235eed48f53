"""How soon a replica's rank is ready, by how it starts: cold, forked from the zygote, or a warm
rank (``serving.warm_spares``).

    python bench/warm_rank_bench.py [--repeats 5] [--world 1] [--device cpu|cuda:N]

For each way, ``--repeats`` times, one replica of ``--world`` ranks on the CPU over gloo, or
all on CUDA device N over NCCL (``serving.replica.Replica``, setup ``load`` as in the pool's
tests, which puts a tensor on the rank's device): the time from its start
(each rank's ``start_rank``) to its READY (every rank joined the group and ran the setup).
The rounds alternate between the ways; medians, and each way's ratio to the cold start, are
printed side by side from one run. What the zygote and the warm ranks paid ahead (their own
start, not counted above) is printed under the table.

- **cold**: ``python -m rankguard.serving.worker`` (``replica.cold_start``);
- **zygote**: forked from a pool's zygote (``serving.pool_zygote.PoolZygote``), as a pool does;
- **warm**: a warm rank that has imported torch (on a GPU also initialised CUDA and made its
  context, which a fork from the zygote cannot carry) takes the rank's environment and channel.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rankguard.deadline import Deadline  # noqa: E402
from rankguard.errors import UsageError  # noqa: E402
from rankguard.serving.placement import CPU, ReplicaPlacement  # noqa: E402
from rankguard.serving.pool_zygote import PoolZygote  # noqa: E402
from rankguard.serving.replica import Replica, StartRank, StartState  # noqa: E402
from rankguard.serving.warm_spares import WarmSpares, check_device  # noqa: E402
from tests.serving import rank_functions as rf  # noqa: E402

START_S = 120.0


def until(condition: Callable[[], bool], changed: threading.Event, what: str) -> None:
    limit = Deadline.after(START_S)
    while not condition():
        if limit.passed():
            raise SystemExit(f"{what} not ready within {START_S:g} s")
        changed.wait(limit.wait_time(cap=1.0))
        changed.clear()


def start_to_ready(placement: ReplicaPlacement, env: dict[str, str], folder: str,
                   start_rank: StartRank | None) -> float:
    """Seconds from the replica's start to its READY."""
    started = time.monotonic()
    replica = Replica(0, placement.world_size, rf.load, folder, env, Deadline.after(START_S),
                      start_rank=start_rank, placement=placement)
    try:
        if replica.wait_started(Deadline.after(START_S)) != StartState.READY:
            raise SystemExit(f"the replica did not start: {replica.failure}")
        assert replica.ready_at is not None
        return replica.ready_at - started
    finally:
        replica.close(Deadline.after(10.0))


def warm_starter(warm: WarmSpares, device: str, world: int, changed: threading.Event
                 ) -> tuple[StartRank, list[float]]:
    """One ready warm rank per rank of the next replica, and their warm-ups in seconds."""
    warm.fill(device, world)
    until(lambda: warm.counts()[device].ready >= world or warm.counts()[device].failed > 0,
          changed, "the warm ranks")
    if warm.counts()[device].failed:
        raise SystemExit(warm.counts()[device].failure)
    starts = [warm.take(device) for _ in range(world)]
    warmups = [s.warmup_s for s in starts if s is not None]

    def start(env: dict[str, str], log: str, channel_fd: int) -> Any:
        rank_start = starts[int(env["RANK"])]
        assert rank_start is not None
        return rank_start(env, log, channel_fd)

    return start, warmups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--device", default=CPU, help="cpu (gloo) or cuda:N (NCCL, every "
                        "rank on device N)")
    args = parser.parse_args()
    try:
        device = check_device(args.device)
    except UsageError as error:
        parser.error(str(error))
    env: dict[str, str] = {}
    if device == CPU:
        placement = ReplicaPlacement(args.world)
    else:
        placement = ReplicaPlacement(args.world, (int(device[5:]),) * args.world)
        if args.world > 1:  # ranks sharing one GPU: NCCL's socket transport on loopback
            from tests.gpu.nccl_ranks import ONE_GPU
            env = dict(ONE_GPU)
    folder = tempfile.mkdtemp(prefix="rankguard-warm-bench-")
    changed = threading.Event()
    zygote = PoolZygote(True, env, folder, START_S, changed.set, lambda *_, **__: None)
    warm = WarmSpares(env, folder, START_S, changed.set)
    ways = ["cold", "zygote", "warm"]
    times: dict[str, list[float]] = {way: [] for way in ways}
    warmups: list[float] = []
    try:
        zygote_started = time.monotonic()
        while zygote.wait_time() is not None:
            changed.wait(START_S)
            changed.clear()
        zygote_s = time.monotonic() - zygote_started
        for round_ in range(args.repeats):
            for way in ways[round_ % 3:] + ways[:round_ % 3]:
                if way == "cold":
                    start_rank = None
                elif way == "zygote":
                    start_rank = zygote.starter(True)
                else:
                    start_rank, paid = warm_starter(warm, device, args.world, changed)
                    warmups.extend(paid)
                times[way].append(start_to_ready(
                    placement, env, os.path.join(folder, f"{way}{round_}"), start_rank))
    finally:
        warm.close(Deadline.after(10.0))
        zygote.close(Deadline.after(10.0))
    cold = statistics.median(times["cold"])
    where = "CPU gloo" if device == CPU else f"{device} NCCL"
    print(f"start -> READY of a replica of {args.world} rank(s), {where}, "
          f"{args.repeats} repeats")
    print(f"{'way':10}{'median':>10}{'min':>10}{'max':>10}{'vs cold':>10}")
    for way in ways:
        med = statistics.median(times[way])
        print(f"{way:10}{med:>9.3f}s{min(times[way]):>9.3f}s{max(times[way]):>9.3f}s"
              f"{med / cold:>9.2f}x")
    print(f"paid ahead: the zygote's start {zygote_s:.2f} s (once); each warm rank's warm-up "
          f"{statistics.median(warmups):.2f} s (median; import torch, on a GPU CUDA too)")
    print("rerun: python bench/warm_rank_bench.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
