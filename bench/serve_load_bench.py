"""rankguard.Pool under concurrent load, with and without faults, against plain gloo groups
served by hand.

    python bench/serve_load_bench.py [--requests 400] [--clients 16] [--timeout 2]
                                     [--forward-ms 5] [--fault-every 40] [--world 2]
                                     [--devices 0,1 | --gpus-per-replica N]

Every figure comes from this one run. ``--clients`` threads send ``--requests`` calls in all,
each as soon as its previous one was answered, each with a deadline of ``--timeout`` s.

1. Throughput without faults, for 1, 2 and 4 replicas (``--world`` ranks each): req/s, p50
   and p99 of rankguard's ``Pool(replicas=R, spares=0)`` and of R plain gloo groups served by
   hand (a queue of idle groups, a Pipe per rank: ``plain_served``).
2. With faults: one call in ``--fault-every`` has rank 1 fault mid-forward, cycling through
   raise, crash, kill, stop, hang and gil. For each server: fault-free calls failed (and per
   fault), their p50 and p99 against the same server's fault-free p99 (a pass without faults
   just before, same load), and how many faults were named right (rank 1, the expected
   cause). Servers: the pool as it was before replicas (one serving group, 2 spares, ranks
   started cold, no suspicion: ``replicas=1, spares=2, suspect_after=timeout, zygote=False``),
   the pool with one and with two replicas (2 spares, forked ranks, suspicion after a fifth of
   the deadline), and two plain groups served by hand, which kill a group whose call failed or
   overran and start a new one (no verdict, no warm spare). Below each pool: its fault-free
   calls that failed and those answered past their deadline, and how its journal says it
   healed: ``group_retire`` by action (``replace``: only the faulty rank gets a new process,
   ``regroup``, ``stacks_then_replace``, ``kill``...) and the ``ranks_replaced`` heals.
3. Heal time, for each pool of 2: a histogram of its heals (a replica lost -> ``replicas``
   healthy again) and how long each replacement took to be ready (journal: a new replica, or
   new ranks in a replica whose faulty ranks were replaced).

``--devices``/``--gpus-per-replica`` put the pools' ranks on GPUs (NCCL), as ``Pool`` takes
them; the plain groups stay on the CPU (gloo).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rankguard  # noqa: E402
from rankguard.records import journal  # noqa: E402

import pool_bench_functions as fns  # noqa: E402
from bench_devices import add_device_options, pool_devices, pool_env  # noqa: E402
from plain_served import PlainFailed, PlainGroup  # noqa: E402

FAULTS = {"raise": "raised", "crash:3": "exited", "kill": "signalled", "stop": "frozen",
          "hang": "deadline", "gil": "deadline"}  # fault (rank 1) -> the cause to report
READY_S = 180.0


@dataclass
class Answer:
    fault: str | None
    ok: bool
    took: float
    what: str  # "ok", a fault's cause, or why the call was not served
    rank: int | None = None


Call = Callable[[str | None], tuple[str, int | None]]  # fault -> (outcome, blamed rank)


def load(call: Call, requests: int, clients: int, fault_every: int) -> tuple[list[Answer], float]:
    """Answers of ``requests`` calls from ``clients`` threads, and the wall time."""
    faults = list(FAULTS)
    counter = iter(range(requests))
    lock = threading.Lock()
    answers: list[Answer] = []

    def client() -> None:
        while True:
            with lock:
                index = next(counter, None)
            if index is None:
                return
            fault = None
            if fault_every and index % fault_every == fault_every // 2:
                fault = f"{faults[(index // fault_every) % len(faults)]}:rank=1"
            started = time.perf_counter()
            what, rank = call(fault)
            answer = Answer(fault, what == "ok", time.perf_counter() - started, what, rank)
            with lock:
                answers.append(answer)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(3600)
    return answers, time.perf_counter() - started


class Rankguard:
    def __init__(self, args: argparse.Namespace, work: int, replicas: int, spares: int,
                 **options: Any) -> None:
        self.work, self.timeout = work, args.timeout
        self.replicas, self.spares = replicas, spares
        self._folder = tempfile.mkdtemp(prefix="serve-load-bench-")
        self.journal = os.path.join(self._folder, "journal.jsonl")
        self.pool = rankguard.Pool(args.world, fns.setup_placed, replicas=replicas,
                                   spares=spares, timeout=args.timeout, start_timeout=READY_S,
                                   journal=self.journal, env=pool_env(args), **options,
                                   **pool_devices(args))
        self.whole()

    def whole(self) -> None:
        """Wait until every replica and spare is ready and idle."""
        until = time.monotonic() + READY_S
        while time.monotonic() < until:
            status = self.pool.status()
            if status.idle + status.spares_ready >= self.replicas + self.spares:
                return
            time.sleep(0.05)
        raise RuntimeError(f"the pool was not whole within {READY_S:g} s")

    def __call__(self, fault: str | None) -> tuple[str, int | None]:
        try:
            self.pool.run(fns.forward, self.work, fault)
            return "ok", None
        except rankguard.RequestFailed as error:
            return error.cause, error.rank
        except rankguard.PoolUnavailable as error:
            return f"unavailable:{error.state}", None

    def starts_since(self, since: float) -> list[float]:
        """Seconds each replacement after ``since`` (wall clock) took to be ready: a replica
        started, or ranks replaced in one."""
        return [e["took_s"] for e in journal.read(self.journal) if e["event"] == "group_ready"
                and e.get("role") in ("started", "ranks_replaced") and e["ts"] >= since]

    def heals_since(self, since: float) -> str:
        """How the pool healed after ``since`` (wall clock), from its journal: its
        retirements by action, and the heals that replaced ranks."""
        events = [e for e in journal.read(self.journal) if e["ts"] >= since]
        actions = Counter(e["action"] for e in events if e["event"] == "group_retire")
        replaced = [e["took_s"] for e in events if e["event"] == "group_ready"
                    and e.get("role") == "ranks_replaced"]
        took = f" (median {statistics.median(replaced):.2f} s)" if replaced else ""
        return (f"group_retire {', '.join(f'{a} {n}' for a, n in actions.most_common())}; "
                f"ranks_replaced {len(replaced)}{took}")

    def close(self) -> None:
        self.pool.close()
        shutil.rmtree(self._folder, ignore_errors=True)


class FairGroups:
    """Idle plain groups handed out first come, first served (a bare queue.Queue lets a client
    that just gave a group back take it again before the clients waiting for one)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._idle: list[PlainGroup] = []
        self._line: list[object] = []

    def get(self, timeout: float) -> PlainGroup | None:
        ticket = object()
        until = time.monotonic() + timeout
        with self._cond:
            self._line.append(ticket)
            try:
                while not (self._idle and self._line[0] is ticket):
                    if not self._cond.wait(until - time.monotonic()):
                        return None
                return self._idle.pop(0)
            finally:
                self._line.remove(ticket)
                self._cond.notify_all()

    def put(self, group: PlainGroup) -> None:
        with self._cond:
            self._idle.append(group)
            self._cond.notify_all()


class Plain:
    """Plain groups served by hand: idle groups handed out in order of arrival; a group whose
    call failed or overran its deadline is killed and a new one started in the background."""

    def __init__(self, args: argparse.Namespace, work: int, replicas: int) -> None:
        self.world, self.work, self.timeout = args.world, work, args.timeout
        self.idle = FairGroups()
        self.groups: list[PlainGroup] = []
        self.lock = threading.Lock()
        for _ in range(replicas):
            self._add(PlainGroup(args.world, READY_S))

    def _add(self, group: PlainGroup) -> None:
        with self.lock:
            self.groups.append(group)
        self.idle.put(group)

    def _replace(self, broken: PlainGroup) -> None:
        broken.kill()
        with self.lock:
            self.groups.remove(broken)
        try:
            self._add(PlainGroup(self.world, READY_S))
        except RuntimeError:
            pass

    def __call__(self, fault: str | None) -> tuple[str, int | None]:
        until = time.monotonic() + self.timeout
        group = self.idle.get(self.timeout)
        if group is None:
            return "unavailable:busy", None
        try:
            group.run(fns.forward, self.work, fault, timeout=max(0.0, until - time.monotonic()))
        except PlainFailed:
            threading.Thread(target=self._replace, args=(group,), daemon=True).start()
            return "failed", None  # no verdict: no rank, no cause
        self.idle.put(group)
        return "ok", None

    def close(self) -> None:
        with self.lock:
            groups = list(self.groups)
        for group in groups:
            group.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] if values else 0


def throughput(args: argparse.Namespace, work: int) -> None:
    print(f"\n1. no faults: {args.requests} calls from {args.clients} clients, {args.world} "
          f"ranks per group, forward of about {args.forward_ms:g} ms + all_reduce")
    print(f"{'':34}{'req/s':>8}{'p50':>10}{'p99':>10}{'failed':>8}")
    for replicas in (1, 2, 4):
        rates = {}
        for name, make in ((f"plain, {replicas} group(s) by hand", lambda: Plain(args, work,
                                                                                   replicas)),
                           (f"rankguard, replicas={replicas}",
                            lambda: Rankguard(args, work, replicas, 0))):
            server = make()
            try:
                load(server, args.clients * 2, args.clients, 0)  # warm
                answers, wall = load(server, args.requests, args.clients, 0)
            finally:
                server.close()
            took = [a.took for a in answers if a.ok]
            rates[name] = len(took) / wall
            print(f"{name:34}{rates[name]:>8.1f}{pct(took, .5) * 1e3:>8.1f}ms"
                  f"{pct(took, .99) * 1e3:>8.1f}ms{len(answers) - len(took):>8}")
        plain, ours = rates.values()
        print(f"{'':34}rankguard / plain req/s: {ours / plain:.2f}")


Heals = dict[str, tuple[list[float], list[float]]]  # server -> (heal times, replacements)


def with_faults(args: argparse.Namespace, work: int) -> Heals:
    faults = args.requests // args.fault_every
    print(f"\n2. faults: 1 call in {args.fault_every} has rank 1 fault mid-forward ({faults} "
          f"faults: {', '.join(FAULTS)}), {args.clients} clients, {args.requests} calls, "
          f"deadline {args.timeout:g} s")
    print(f"{'':34}{'fault-free failed':>18}{'per fault':>10}{'p50':>9}{'p99':>9}"
          f"{'p99 / no-fault p99':>20}{'named':>7}")
    heals: Heals = {}
    before = {"suspect_after": args.timeout, "zygote": False}  # the pool before replicas
    for name, make in (("rankguard before: 1 group, 2 spares",
                        lambda: Rankguard(args, work, 1, 2, **before)),
                       ("rankguard, replicas=1 spares=2", lambda: Rankguard(args, work, 1, 2)),
                       ("rankguard, replicas=2 spares=2", lambda: Rankguard(args, work, 2, 2)),
                       ("plain, 2 groups by hand", lambda: Plain(args, work, 2))):
        server = make()
        try:
            load(server, args.clients * 2, args.clients, 0)  # warm
            calm, _ = load(server, args.requests, args.clients, 0)
            if isinstance(server, Rankguard):
                server.whole()
                since = time.time()
                healed = len(server.pool.heal_durations())
            answers, _ = load(server, args.requests, args.clients, args.fault_every)
            healing = ""
            if isinstance(server, Rankguard):
                server.whole()  # the replicas that faults retired are replaced
                heals[name] = (server.pool.heal_durations()[healed:], server.starts_since(since))
                healing = server.heals_since(since)
        finally:
            server.close()
        base = pct([a.took for a in calm if a.ok], .99)
        clean = [a for a in answers if a.fault is None]
        failed = [a for a in clean if not a.ok]
        took = [a.took for a in clean if a.ok]
        faulty = [a for a in answers if a.fault is not None]
        named = sum(1 for a in faulty if a.rank == 1 and a.what == FAULTS[a.fault.split(":r")[0]])
        why = statistics.mode([a.what for a in failed]) if failed else ""
        print(f"{name:34}{len(failed):>6}/{len(clean)} ({len(failed) / len(clean):>4.0%})"
              f"{len(failed) / max(1, len(faulty)):>10.1f}{pct(took, .5) * 1e3:>7.0f}ms"
              f"{pct(took, .99) * 1e3:>7.0f}ms{pct(took, .99) / base:>19.1f}x"
              f"{named:>4}/{len(faulty)}" + (f"   (mostly {why})" if why else ""))
        late = [a.took - args.timeout for a in clean if a.took > args.timeout]
        print(f"{'':4}fault-free calls failed: {len(failed)} of {len(clean)} "
              f"({len(failed) / len(clean):.1%}); fault-free calls past their deadline: "
              f"{len(late)}" + (f" (answered up to {max(late) * 1e3:.0f} ms after it)"
                                if late else ""))
        if healing:
            print(f"{'':4}heals (journal): {healing}")
    return heals


def heal_times(heals: Heals) -> None:
    bounds = (0.001, 0.01, 0.1, 1.0, 5.0, 30.0)
    print("\n3. during the faults of 2: heal time (a replica lost -> `replicas` healthy ones "
          "again), as a histogram, and how long each replacement took to be ready (a new "
          "replica, or new ranks in one)")
    print(f"{'':34}" + "".join(f"{f'<{b:g} s':>8}" for b in bounds) +
          f"{'median':>9}{'max':>9}{'replaced':>9}{'median':>9}{'max':>9}")
    for name, (healed, starts) in heals.items():
        counts = [sum(1 for h in healed if low <= h < high)
                  for low, high in zip((0.0, *bounds), bounds)]
        print(f"{name:34}" + "".join(f"{c:>8}" for c in counts) +
              f"{statistics.median(healed) if healed else 0:>8.3f}s{max(healed, default=0):>8.3f}s"
              f"{len(starts):>9}{statistics.median(starts) if starts else 0:>8.2f}s"
              f"{max(starts, default=0):>8.2f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--forward-ms", type=float, default=5.0)
    parser.add_argument("--fault-every", type=int, default=40)
    parser.add_argument("--world", type=int, default=2)
    add_device_options(parser)
    parser.add_argument("--only", default="1,2", help="sections to run (1: throughput, 2: "
                        "faults and heal times)")
    args = parser.parse_args()
    work = fns.calibrate(args.forward_ms / 1e3)
    print(f"forward: {work} matmuls of 128x128 (about {args.forward_ms:g} ms on one core); "
          f"{os.cpu_count()} CPU cores" + (f"; the pools' ranks on {pool_devices(args)} (NCCL), "
                                           "the plain groups on the CPU (gloo)"
                                           if pool_devices(args) else ""))
    sections = args.only.split(",")
    try:
        if "1" in sections:
            throughput(args, work)
        if "2" in sections:
            heal_times(with_faults(args, work))
    except rankguard.UsageError as error:  # --devices this machine cannot give, say
        raise SystemExit(f"serve_load_bench: {error}") from None


if __name__ == "__main__":
    main()
