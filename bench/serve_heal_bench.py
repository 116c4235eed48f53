"""How long a pool takes to serve again after a fault when it replaces only the faulty rank,
beside restarting the whole replica, split into where the time goes.

    python bench/serve_heal_bench.py [--repeats 5] [--world 2] [--timeout 1] [--setup-s 0]
                                     [--kinds kill,exit,freeze,hang] [--heal-bound 120]
                                     [--devices 0 | --gpus-per-replica 1]

Every figure comes from this one run, on ``Pool(world, setup, replicas=1, spares=0)`` (no spare:
the next call waits for the heal, ``on_healing="wait"``). Each trial starts a call in which
rank 1 faults mid-forward and measures the wall time from that call's start to the end of the
first call that succeeds after it (retried, each with a long deadline, until ``--heal-bound``
s; the bench exits 1 naming the fault if none does by then, after the table of the trials that
ended; each trial's figure is printed as it ends, and an interrupted bench (SIGINT) prints the
table of those that ended). Rows:

- **rank replaced** (``kill``: SIGKILL, ``exit``: exit 3, ``freeze``: SIGSTOP, ``hang``: a
  deadlock, found at the ``--timeout`` deadline): the pool keeps rank 0's process and starts a
  new rank 1 (forked from the zygote), which joins rank 0's new generation and runs the setup.
  The journal's ``group_ready`` (role ``ranks_replaced``) splits the heal into its parts;
- **whole replica, forked**: every rank SIGKILLs itself, so nothing is kept and a new replica
  starts (both ranks forked from the zygote, a new group, both setups);
- **whole replica, cold** (and **kill, cold rank** beside it): the same on a pool with
  ``zygote=False``, where each new rank is a new Python that imports torch.

``--setup-s`` makes the setup sleep that long (a stand-in for loading a shard's weights), which
a replacement pays once for its own rank and a new replica once per rank, in parallel.
``--devices 0`` (both ranks on GPU 0: the pool gives each its own NCCL host id) or
``--gpus-per-replica N`` run the ranks on GPUs over NCCL; the ``device`` part is then the new
rank's CUDA context.

Parts (medians, ms): detection (the faulty call's start to its error), stacks (for a hang: the
culprit's stacks, taken before it is replaced), stop (the unusable rank killed and reaped),
process (the new rank's process started, until its code ran), runtime init (the rank
runtime's init, which imports torch in a cold rank), device, group (joining the survivors' new
generation; on NCCL the communicator forms at the first collective, in the remainder), setup;
for a whole replica, its start (new processes to every rank ready); the remainder is what no
part covers (the leader's bookkeeping, messages, the first call after the heal).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rankguard  # noqa: E402
from rankguard.records import journal  # noqa: E402

import pool_bench_functions as fns  # noqa: E402
from bench_devices import add_device_options, pool_devices, pool_env  # noqa: E402

KINDS = {"kill": "kill:rank=1", "exit": "crash:3:rank=1", "freeze": "stop:rank=1",
         "hang": "hang:rank=1"}  # --kinds -> the fault rank 1 performs mid-forward
WHOLE = "whole"  # a trial in which every rank dies (fns.die): a new replica
READY_S = 180.0  # a pool's first replica, and the pool whole again between trials
WARM_CALL_S = 30.0  # the deadline of the call before each trial (as the GPU tests give one)
PARTS = [("detection", "detection (fault -> error)"), ("stacks", "stacks (hangs only)"),
         ("stop", "stop (kill, reap)"), ("process", "process start"),
         ("init", "runtime init (torch)"), ("device", "device (CUDA context)"),
         ("group", "group (join generation)"), ("setup", "setup"),
         ("replica", "whole replica start"), ("remainder", "remainder")]


NEW_RANK = ("process", "init", "device", "group", "setup")  # a new rank's own parts


class NoHeal(SystemExit):
    """The pool did not serve again within the bound: the bench ends with exit status 1."""


@dataclass
class Row:
    """One row of the table: a fault on a pool, and what each of its trials measured."""

    name: str
    fault: str  # a KINDS value, or WHOLE
    zygote: bool
    totals: list[float] = field(default_factory=list)
    parts: list[dict[str, float]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)

    def median(self) -> float:
        return statistics.median(self.totals)


class Bench:
    """A pool of one replica, no spare, and its journal."""

    def __init__(self, args: argparse.Namespace, zygote: bool) -> None:
        self.args = args
        self._folder = tempfile.mkdtemp(prefix="serve-heal-bench-")
        self.log = os.path.join(self._folder, "journal.jsonl")
        self.pool = rankguard.Pool(args.world, fns.setup_placed, replicas=1, spares=0,
                                   timeout=args.timeout, start_timeout=READY_S,
                                   on_healing="wait", journal=self.log, zygote=zygote,
                                   env={fns.SETUP_S_ENV: str(args.setup_s), **pool_env(args)},
                                   **pool_devices(args))

    def whole(self) -> None:
        """Wait, ``READY_S`` at most, until the replica is ready and idle."""
        until = time.monotonic() + READY_S
        while self.pool.status().idle < 1:
            if time.monotonic() > until:
                raise NoHeal(f"serve_heal_bench: the pool was not whole within {READY_S:g} s")
            time.sleep(0.02)

    def trial(self, row: Row, work: int) -> None:
        """One fault on the pool, and the first call served after it."""
        self.whole()
        # the replica is warm (not timed: a new NCCL group forms its communicator in its
        # first collective, which can take longer than the faulty call's --timeout)
        self.pool.run(fns.forward, work, timeout=max(self.args.timeout, WARM_CALL_S))
        seen = len(list(journal.read(self.log)))
        started = time.perf_counter()
        try:
            if row.fault == WHOLE:
                self.pool.run(fns.die)
            else:
                self.pool.run(fns.forward, work, row.fault)
            raise NoHeal(f"serve_heal_bench: {row.name}: the faulty call succeeded")
        except rankguard.RequestFailed:
            detected = time.perf_counter() - started
        self._served_again(row, work)
        total = time.perf_counter() - started
        events = list(journal.read(self.log))[seen:]
        row.totals.append(total)
        row.actions.append("+".join(e["action"] for e in events
                                    if e["event"] == "group_retire"))
        row.parts.append(parts_of(events, detected, total))

    def _served_again(self, row: Row, work: int) -> None:
        """Retry a healthy call until one succeeds, for ``--heal-bound`` s at most."""
        bound = self.args.heal_bound
        until = time.monotonic() + bound
        last = "no call was answered"
        while time.monotonic() < until - self.pool.min_call_s:
            try:
                self.pool.run(fns.forward, work,
                              timeout=max(self.pool.min_call_s, until - time.monotonic()))
                return
            except (rankguard.RequestFailed, rankguard.PoolUnavailable) as error:
                last = f"{type(error).__name__}: {error}"
                time.sleep(0.05)  # a pool whose start-ups fail answers at once
        retired = [f"{e['action']} ({e['reason']})" for e in journal.read(self.log)
                   if e["event"] == "group_retire"]
        raise NoHeal(f"serve_heal_bench: no call was served within {bound:g} s of the fault "
                     f"({row.name}): the pool did not heal (last: {last}; the journal's last "
                     f"retirement: {retired[-1] if retired else 'none'})")

    def close(self) -> None:
        self.pool.close()
        shutil.rmtree(self._folder, ignore_errors=True)


def parts_of(events: list[dict[str, Any]], detected: float, total: float) -> dict[str, float]:
    """Seconds per part of one trial, from its journal ``events``; the remainder is the total
    less every part."""
    parts = {"detection": detected}
    stamps = {e["event"]: e["ts"] for e in events}
    for event in events:
        if event["event"] == "group_ready" and event.get("role") == "ranks_replaced":
            took = event["parts"]
            parts["stacks"] = max(0.0, stamps["ranks_replace"] - stamps["group_retire"])
            parts["stop"] = took["stop"]
            for part in NEW_RANK:
                parts[part] = sum(v for k, v in took.items()
                                  if k.startswith("rank") and k.endswith(f"_{part}"))
        elif event["event"] == "group_ready" and event.get("role") == "started":
            parts["replica"] = event["took_s"]
    parts["remainder"] = total - sum(parts.values())
    return parts


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f}" if seconds >= 0.0095 else f"{seconds * 1e3:.1f}"


def report(rows: list[Row], args: argparse.Namespace) -> None:
    """The table of ``rows``, each with one trial or more."""
    if not rows:
        return
    where = pool_devices(args) or "the CPU, gloo"
    print(f"\nfault -> next call served: {args.repeats} trials each, {args.world} ranks, "
          f"rank 1 faulty, Pool(replicas=1, spares=0), deadline {args.timeout:g} s, setup "
          f"{args.setup_s:g} s, on {where}")
    base = {True: next((r for r in rows if r.fault == KINDS["kill"] and r.zygote), None),
            False: next((r for r in rows if r.fault == KINDS["kill"] and not r.zygote), None)}
    print(f"{'':28}{'median':>9}{'min':>9}{'max':>9}{'x kill':>8}  heal (journal)")
    for row in rows:
        ref = base[row.zygote] or base[True]
        ratio = f"{row.median() / ref.median():>7.1f}x" if ref else f"{'-':>8}"
        actions = sorted(set(row.actions))
        print(f"{row.name:28}{row.median():>8.3f}s{min(row.totals):>8.3f}s"
              f"{max(row.totals):>8.3f}s{ratio}  {', '.join(actions)}")
    print("\nwhere the time went (ms, means over the trials, so that the parts add up to the "
          "mean total)")
    width = max(12, *(len(r.name) + 2 for r in rows))
    print(f"{'':28}" + "".join(f"{r.name:>{width}}" for r in rows))
    for key, label in PARTS:
        if not any(key in p for r in rows for p in r.parts):
            continue
        cells = [ms(statistics.mean(p.get(key, 0.0) for p in r.parts))
                 if any(key in p for p in r.parts) else "-" for r in rows]
        print(f"{label:28}" + "".join(f"{c:>{width}}" for c in cells))
    print(f"{'total':28}" + "".join(f"{ms(statistics.mean(r.totals)):>{width}}" for r in rows))
    print("\nwhole replica restarted / rank replaced after a kill (medians):")
    for whole in (r for r in rows if r.fault == WHOLE):
        against = [f"{whole.median() / r.median():.2f}x {r.name}" for r in rows
                   if r.fault == KINDS["kill"] and (r.zygote or not whole.zygote)]
        print(f"  {whole.name}: " + ", ".join(against))


def rows_for(args: argparse.Namespace) -> dict[bool, list[Row]]:
    """The rows of each pool (zygote or not), in the order their trials alternate."""
    kinds = [kind.strip() for kind in args.kinds.split(",") if kind.strip()]
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown:
        raise SystemExit(f"serve_heal_bench: --kinds: {', '.join(unknown)} is not one of "
                         f"{', '.join(KINDS)}")
    rows = {True: [Row(f"{kind}: rank replaced", KINDS[kind], True) for kind in kinds]
            + [Row("whole replica, forked", WHOLE, True)]}
    if not args.no_cold:
        rows[False] = [Row("kill, cold rank", KINDS["kill"], False),
                       Row("whole replica, cold", WHOLE, False)]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1.0,
                        help="the faulty call's deadline: a hang is found then (s)")
    parser.add_argument("--setup-s", type=float, default=0.0,
                        help="seconds each rank's setup sleeps (loading its weights)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"faults whose rank is replaced: {', '.join(KINDS)}")
    parser.add_argument("--heal-bound", type=float, default=120.0,
                        help="seconds after a fault by which a call must be served again")
    parser.add_argument("--no-cold", action="store_true",
                        help="leave out the pool without zygote (cold ranks)")
    add_device_options(parser)
    args = parser.parse_args()
    if args.world < 2 or args.repeats < 1:
        raise SystemExit("serve_heal_bench: give --world 2 or more (rank 1 faults) and "
                         "--repeats 1 or more")
    work = fns.calibrate(0.002)
    rows = rows_for(args)
    started = time.perf_counter()
    failed: NoHeal | None = None
    try:  # each trial's figure as it ends: a run cut short (SIGINT, no heal) still reports
        for zygote, pool_rows in rows.items():
            try:
                bench = Bench(args, zygote)
            except rankguard.UsageError as error:
                raise SystemExit(f"serve_heal_bench: {error}") from None
            try:
                for _ in range(args.repeats):
                    for row in pool_rows:
                        bench.trial(row, work)
                        print(f"{row.name}: served again {row.totals[-1]:.3f} s after the "
                              f"fault ({row.actions[-1] or 'no retirement'})", flush=True)
            finally:
                bench.close()
    except KeyboardInterrupt:
        print("serve_heal_bench: interrupted; the table has the trials that ended")
    except NoHeal as error:
        failed = error
    report([row for pool_rows in rows.values() for row in pool_rows if row.totals], args)
    print(f"\n(one run, {time.perf_counter() - started:.0f} s, {os.cpu_count()} CPU cores)")
    if failed is not None:
        raise failed


if __name__ == "__main__":
    main()
