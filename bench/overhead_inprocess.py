"""Instrumentation cost per collective, in one process (run by bench/overhead_bench.py).

1. Paired, interleaved rounds of a 1-rank all_reduce on a plain gloo process group (built as
   torch builds one) and on rankguard's group in the same process: the median difference (scheduling noise on a 2-core machine is several
   microseconds per op either way, hence pairs and a median).
2. The deterministic part: what the instrumented op does beyond forwarding to gloo (ledger enter,
   completion tracking including marking the previous op done), timed on its own.
"""
import statistics
import tempfile
import time
import timeit

import torch
import torch.distributed as dist

from plain_group import side_by_side
from rankguard import ledger
from rankguard.runtime import instrument, state

path = tempfile.mktemp(prefix="rankguard-bench-")
ledger.create(path, 1)
state.current().ledger = ledger.LedgerWriter(path)
instrument.install()
ours, plain, gloo = side_by_side()
t = torch.ones(1)
opts = dist.AllreduceOptions()
opts.asyncOp = False  # as dist.all_reduce issues it


def per_op_us(pg, n=3000):
    start = time.perf_counter()
    for _ in range(n):
        pg.allreduce([t], opts).wait()
    return (time.perf_counter() - start) / n * 1e6


for pg in (plain, ours):
    per_op_us(pg, 500)
pairs = [(per_op_us(plain), per_op_us(ours)) for _ in range(31)]
print(f"paired_plain_us={statistics.median(p for p, _ in pairs):.2f}")
print(f"paired_ours_us={statistics.median(o for _, o in pairs):.2f}")
print(f"paired_diff_us={statistics.median(o - p for p, o in pairs):.2f}")
slot = state.current().ledger.world()
work = gloo.allreduce([t], opts)
work.wait()
n = 200_000
enter = timeit.timeit(lambda: slot.enter(2), number=n) / n * 1e6
track = timeit.timeit(lambda: state.current().completions.add(slot, work), number=n) / n * 1e6
print(f"ledger_enter_us={enter:.3f}")
print(f"completion_add_us={track:.3f}")
state.current().completions.close()
dist.destroy_process_group()
