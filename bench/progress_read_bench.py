"""Reading every rank's progress at 10,000 ranks, once per tick, from a real TCPStore.

    python bench/progress_read_bench.py [--nodes 1250] [--ranks-per-node 8] [--repeat 10]

The store's server runs in a process of its own (as the store's host agent does for the other
nodes). It is filled as a job of ``--nodes`` nodes of ``--ranks-per-node`` ranks would fill it:

- rankguard: one beat per node (``launcher/node_beats.py``: its sequence number, host and its
  ranks' ``[rank, entered, done, kind]``, and on a line of its own with every rank in two
  sub-groups too, ``key, members, entered, done, kind`` each), read by each agent once per tick with one
  ``multi_get`` of every node's key, then taken in as its hang rules see them
  (``launcher/remote_progress.py``: every beat decoded, as when every node beat since;
  records for the hang rules are made only while some rank has waited a whole hang timeout,
  shown on a line of its own);
- per-rank keys, read the way a naive monitor would: one ``get`` per rank, and one
  ``multi_get`` of every rank's key (the figure the issue cites for torch's TCPStore).

Medians of ``--repeat`` reads, side by side, from one run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from rankguard.records.beats import encode  # noqa: E402
from rankguard.launcher.remote_progress import RemoteProgress  # noqa: E402

SERVER = """
import sys, time
from datetime import timedelta
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60))
print(store.port, flush=True)
sys.stdin.read()
"""


def timed(call, repeat: int) -> float:
    """Median seconds of ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    from torch.distributed import TCPStore

    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        nodes, per = args.nodes, args.ranks_per_node
        beat_keys = [f"/b/beat{n}" for n in range(nodes)]
        sub_keys = [f"/s/beat{n}" for n in range(nodes)]
        rank_keys = [f"/r/rank{r}" for r in range(nodes * per)]
        for node, key in enumerate(beat_keys):
            ranks = [[node * per + i, 12345, 12344, 2] for i in range(per)]
            store.set(key, encode(1, f"node{node}.cluster.example", ranks))
            # the same ranks, each in two sub-groups as well (tensor and pipeline parallel)
            subs = [[*rank, 7 + rank[0] % per, 0b11, 501, 500, 2, 9, 0b101, 301, 300, 5]
                    for rank in ranks]
            store.set(sub_keys[node], encode(1, f"node{node}.cluster.example", subs))
        for rank, key in enumerate(rank_keys):
            store.set(key, json.dumps([12345, 12344, 2]))

        def beats(suspected: bool = False, keys: list[str] = beat_keys) -> None:
            values = store.multi_get(keys)
            remote = RemoteProgress(nodes * per, set())
            remote.update({node: (value, 0.0) for node, value in enumerate(values)})
            remote.snapshots(-1.0, local_waiting=suspected)

        def per_rank_gets() -> None:
            for key in rank_keys:
                json.loads(store.get(key))

        def per_rank_multi_get() -> None:
            for value in store.multi_get(rank_keys):
                json.loads(value)

        ours = timed(beats, args.repeat)
        suspected = timed(lambda: beats(suspected=True), args.repeat)
        with_subs = timed(lambda: beats(keys=sub_keys), args.repeat)
        sub_size = sum(len(store.get(key)) for key in sub_keys)
        naive = timed(per_rank_gets, max(3, args.repeat // 3))
        multi = timed(per_rank_multi_get, args.repeat)
        size = sum(len(store.get(key)) for key in beat_keys)
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    total = nodes * per
    print(f"progress of {total} ranks ({nodes} nodes x {per}), one read per tick, "
          f"median of {args.repeat}:")
    print(f"  rankguard, one multi_get of {nodes} node beats ({size / 1e3:.0f} kB): "
          f"{ours * 1e3:8.1f} ms")
    print(f"    the same while a hang is suspected (every rank as a record for the rules): "
          f"{suspected * 1e3:.1f} ms")
    print(f"    every rank in two sub-groups as well ({sub_size / 1e3:.0f} kB):          "
          f"{with_subs * 1e3:8.1f} ms")
    print(f"  a get per rank ({total} requests):               {naive * 1e3:8.1f} ms"
          f"   ratio {naive / ours:5.1f}x")
    print(f"  one multi_get of {total} per-rank keys:          {multi * 1e3:8.1f} ms"
          f"   ratio {multi / ours:5.1f}x")


if __name__ == "__main__":
    main()
