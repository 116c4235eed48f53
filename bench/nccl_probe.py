"""Measure, on one GPU, the NCCL facts that rankguard's NCCL observation and abort design rests on.

    python bench/nccl_probe.py --json OUT.json [--budget 230] [--scenarios api_timing,sleep_hang,...]
    python bench/nccl_probe.py --dry --json /tmp/probe.json     # control flow only: gloo on CPU

Two ranks share one GPU (distinct ``NCCL_HOSTID`` per rank, P2P/SHM/IB/NVLS/CollNet off, sockets on
``lo``). The parent process hosts a TCPStore, runs each scenario as fresh rank processes (their own
sessions, killed with SIGKILL at the scenario's deadline and at the end) and bounds the whole run by
``--budget`` seconds. Every rank writes its findings to a JSON file after each step, so a rank that
hangs or dies still reports how far it got. Scenarios, most valuable first:

- ``api_timing`` / ``api_notiming`` (item 1): 2100 small all_reduces fill the Flight Recorder
  (2000 entries); which dump bindings exist (``_dump_nccl_trace_json``, ``_dump_nccl_trace``,
  ``_dump_fr_trace_json``, ``_dump_fr_trace``), their output shape (top-level keys, ``pg_status``,
  entry fields, whether ``time_discovered_started_ns`` is filled), and what one dump costs, with
  ``TORCH_NCCL_ENABLE_TIMING`` 1 and 0.
- ``sleep_hang`` (item 2): rank 1 sleeps in Python before all_reduce #51 of a 1 MB loop of
  100. Rank 0's helper thread reads ``pg_status`` every 0.2 s while rank 0's main thread is blocked
  in ``torch.cuda.synchronize()`` (phase ``sync``), then in ``work.wait()`` and
  ``work.wait(timeout)`` (phase ``wait``); rank 1 reads its own view while it sleeps.
- ``gpu_stuck`` (items 3, 4, 5, 6): rank 1 enqueues ``torch.cuda._sleep(huge)`` before #51, then
  the rest of the loop, and blocks in ``synchronize()``; both ranks sample ``pg_status``. Rank 0's
  helper thread times ``work.is_completed()`` on the stuck work, then calls
  ``distributed_c10d._abort_process_group()`` while rank 0's main thread is blocked in
  ``synchronize()``; rank 0 then checks CUDA (matmul + synchronize). The parent SIGKILLs the
  GPU-stuck rank 1 (timing the reap) and starts a replacement, and the two form a new group on the
  store prefix ``gpu_stuck/gen1`` and all_reduce. ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` is left at
  torch's default (3) here, to see whether the watchdog interferes after an abort.
- ``cpu_hang`` (items 4, 6): rank 1 stops before #51 (waits on a store key); rank 0's helper calls
  ``pg.abort()`` while its main thread is blocked in ``synchronize()``, then rank 0 runs
  ``destroy_process_group()``; rank 1 then aborts and destroys too, and both form a new group on
  ``cpu_hang/gen1``. ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` here (what ``_abort_process_group``'s
  docstring asks for: the caller, not the watchdog, handles errors).

- ``peer_death_sync`` / ``peer_death_wait`` / ``peer_death_blocking``: what a survivor's
  collective gives when its peer dies in it, with ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` (what
  rankguard sets: torch's watchdog only marks the work failed). Rank 1 exits (``os._exit``) 1 s
  into rank 0's all_reduce of rank+1 (3.0 with both); rank 0 reads the result after
  ``dist.all_reduce`` (``sync``), after ``work.wait()`` (``wait``), or with
  ``TORCH_NCCL_BLOCKING_WAIT=1`` (``blocking``), and records the value, the time, whatever
  raised, the work's exception 2 s later, and a next all_reduce. Seen in the GPU set (H100,
  2026-11-28): a survivor read its own value (1.0 for 2.0) and went on.

The NCCL timeout of every group is 100 s, longer than any scenario, so the watchdog's own timeout
never fires; any FR dump file the watchdog writes lands in the scenario's folder and is reported.
The report is printed and, with ``--json``, written in full (summary + every rank's raw record).
Figures from a run on an H100 (torch 2.11.0+cu130, NCCL 2.28.9): ``docs/nccl-probe-2.11.md``.
On a GPU machine the run takes about 90 s; without CUDA it exits 2 unless ``--dry`` is given.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional

PEER_DEATH = ("peer_death_sync", "peer_death_wait", "peer_death_blocking")
SCENARIOS = ("api_timing", "sleep_hang", "gpu_stuck", "cpu_hang", "api_notiming", *PEER_DEATH)
DUMP_NAMES = ("_dump_nccl_trace_json", "_dump_nccl_trace", "_dump_fr_trace_json", "_dump_fr_trace")
PG_TIMEOUT_S = 100.0
LOOP = 100  # collectives per hang loop; the fault is placed before #STUCK_AT
STUCK_AT = 51
MB_FLOATS = 262144  # 1 MB of float32
GPU_SLEEP_CYCLES = 1 << 42  # about 35 minutes at 2 GHz: longer than anything here
SAMPLE_PERIOD_S = 0.2


# ----------------------------------------------------------------------------------------------
# rank side
# ----------------------------------------------------------------------------------------------
class Record:
    """A rank's findings, rewritten atomically to its file after every change."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.t0 = time.monotonic()
        self.data: Dict[str, Any] = {"steps": [], "pid": os.getpid()}
        self.lock = threading.Lock()
        self.main_in = "start"

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 4)

    def set(self, key: str, value: Any) -> None:
        with self.lock:
            self.data[key] = value
            self._save()

    def append(self, key: str, value: Any) -> None:
        with self.lock:
            self.data.setdefault(key, []).append(value)
            self._save()

    def _save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, default=repr)
        os.replace(tmp, self.path)

    @contextlib.contextmanager
    def step(self, name: str, main: bool = True):
        """Times a step; records its exception and re-raises it."""
        entry: Dict[str, Any] = {"name": name, "t": self.now(), "thread": threading.current_thread().name}
        if main:
            self.main_in = name
        self.append("steps", entry)
        start = time.monotonic()
        try:
            yield entry
            entry["ok"] = True
        except BaseException as exc:
            entry["ok"] = False
            entry["error"] = f"{type(exc).__module__}.{type(exc).__name__}: {str(exc)[:600]}"
            raise
        finally:
            entry["s"] = round(time.monotonic() - start, 4)
            if main:
                self.main_in = "python"
            with self.lock:
                self._save()

    def attempt(self, name: str, fn: Callable[[], Any], main: bool = True) -> Any:
        """Runs fn as a step; returns its result, or None when it raised (the error is recorded)."""
        try:
            with self.step(name, main) as entry:
                result = fn()
                if isinstance(result, (bool, int, float, str)) or result is None:
                    entry["result"] = result
                return result
        except Exception:
            return None


class Rank:
    """One rank process of a scenario: its store, group, device and progress reader."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.args = torch, dist, args
        self.rank, self.scenario, self.dry = args.rank, args.worker, args.dry
        self.rec = Record(args.result)
        self.rec.set("role", {"scenario": self.scenario, "rank": self.rank, "gen": args.gen})
        self.store = dist.TCPStore("127.0.0.1", args.port, is_master=False, timeout=timedelta(seconds=30))
        self.device = torch.device("cpu") if self.dry else torch.device("cuda:0")
        self.key_wait_s = 8.0 if self.dry else 45.0
        self.c10d = torch._C._distributed_c10d
        reader = next((n for n in ("_dump_nccl_trace_json", "_dump_fr_trace_json") if hasattr(self.c10d, n)), None)
        self.reader_name = reader
        self.rec.set("progress_reader", reader)

    # -- group -------------------------------------------------------------------------------
    def init_group(self, gen: int) -> None:
        dist = self.dist
        kwargs: Dict[str, Any] = {}
        if not self.dry:
            self.torch.cuda.set_device(0)
            kwargs["device_id"] = self.device
        store = dist.PrefixStore(f"{self.scenario}/gen{gen}", self.store)
        with self.rec.step(f"init_process_group gen{gen}"):
            dist.init_process_group(
                "gloo" if self.dry else "nccl", store=store, rank=self.rank, world_size=2,
                timeout=timedelta(seconds=PG_TIMEOUT_S), **kwargs,
            )
        if gen == self.args.gen and "versions" not in self.rec.data:
            torch = self.torch
            versions = {"torch": torch.__version__, "cuda": torch.version.cuda}
            if not self.dry:
                versions["nccl"] = nccl_version(torch)
                versions["device"] = torch.cuda.get_device_name(0)
            versions["env"] = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_NCCL", "TORCH_FR"))}
            self.rec.set("versions", versions)

    def all_reduce_check(self, label: str, gen: int) -> None:
        """One all_reduce of rank+1 (expects 3.0 everywhere), then ten more and a synchronize."""
        t = self.torch.full((1024,), float(self.rank + 1), device=self.device)
        with self.rec.step(f"all_reduce check {label}") as entry:
            self.dist.all_reduce(t)
            self.sync()
            entry["value"] = float(t[0].item())
            entry["correct"] = entry["value"] == 3.0
        with self.rec.step(f"10 all_reduces {label}"):
            for _ in range(10):
                self.dist.all_reduce(t)
            self.sync()

    def warmup(self, x: Any, key: str, prefix: str = "") -> None:
        """Three all_reduces and a synchronize; rec[key] = the seq they end at (the loop's base)."""
        with self.rec.step(f"{prefix}warmup 3 all_reduces"):
            for _ in range(3):
                self.dist.all_reduce(x)
            self.sync()
        self.rec.set(key, self.base_seq())

    def start_hang_scenario(self) -> tuple:
        """Group gen0, a 1 MB tensor, warmup, and a running sampler: (tensor, stop event, thread)."""
        self.init_group(0)
        x = self.torch.zeros(MB_FLOATS, device=self.device)
        self.warmup(x, "base_seq")
        stop = threading.Event()
        return x, stop, self.sampler("samples", stop)

    def regroup(self) -> None:
        """A new group on the store prefix gen1, checked by all_reduces, then destroyed."""
        self.init_group(1)
        self.all_reduce_check("gen1", 1)
        self.rec.attempt("destroy_process_group gen1", lambda: self.dist.destroy_process_group())

    def sync(self) -> None:
        if not self.dry:
            self.torch.cuda.synchronize()

    def wait_key(self, key: str) -> None:
        self.store.wait([key], timedelta(seconds=self.key_wait_s))

    # -- progress ----------------------------------------------------------------------------
    def read(self, collectives: bool = True, only_active: bool = True) -> Dict[str, Any]:
        """One progress read: pg_status per group, and the active entries' seq/state summary."""
        fn = getattr(self.c10d, self.reader_name)
        start = time.monotonic()
        raw = fn(collectives, only_active)
        ms = (time.monotonic() - start) * 1000
        dump = json.loads(raw)
        out: Dict[str, Any] = {"ms": round(ms, 3), "status": dump.get("pg_status")}
        entries = dump.get("entries") or []
        if collectives:
            states: Dict[str, int] = {}
            for e in entries:
                states[str(e.get("state"))] = states.get(str(e.get("state")), 0) + 1
            out["active"] = {
                "n": len(entries),
                "states": states,
                "first": [(e.get("collective_seq_id"), e.get("state"), e.get("profiling_name")) for e in entries[:3]],
                "last": [(e.get("collective_seq_id"), e.get("state")) for e in entries[-1:]],
            }
        return out

    def sampler(self, key: str, stop: threading.Event, period: float = SAMPLE_PERIOD_S) -> threading.Thread:
        """A daemon thread reading progress every period into rec[key] until stop is set."""
        rec = self

        def run() -> None:
            while not stop.is_set():
                rec.rec.set(f"{key}__calling_since", rec.rec.now())
                t = rec.rec.now()
                main_in = rec.rec.main_in
                try:
                    sample = rec.read()
                except Exception as exc:
                    sample = {"error": repr(exc)[:300]}
                sample.update(t=t, main_in=main_in)
                rec.rec.append(key, sample)
                rec.rec.set(f"{key}__calling_since", None)
                stop.wait(period)

        th = threading.Thread(target=run, name=f"sampler-{key}", daemon=True)
        th.start()
        return th

    def stop_sampler(self, key: str, stop: threading.Event, th: threading.Thread) -> None:
        stop.set()
        th.join(5)
        self.rec.set(f"{key}__sampler_hung", th.is_alive())

    def base_seq(self) -> Optional[int]:
        try:
            st = self.read(collectives=False)["status"] or {}
            return progress(next(iter(st.values())))[0] if st else None
        except Exception:
            return None

    def loop(self, tensor: Any, before: Optional[Callable[[int], None]] = None) -> List[Any]:
        """LOOP async all_reduces; before(i) runs before collective #i (1-based)."""
        works = []
        for i in range(1, LOOP + 1):
            if before is not None:
                before(i)
            works.append(self.dist.all_reduce(tensor, async_op=True))
        return works


def nccl_version(torch: Any) -> str:
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def progress(status: Dict[str, Any]) -> tuple:
    """(last enqueued, started, completed) collective seq from one group's pg_status."""
    def pick(word: str) -> Any:
        for k, v in status.items():
            if word in k and "collective" in k:
                return v
        for k, v in status.items():
            if word in k:
                return v
        return None

    def num(v: Any) -> Any:
        try:
            return int(v)
        except (TypeError, ValueError):
            return v

    return num(pick("enqueued")), num(pick("started")), num(pick("completed"))


def summarize_dump(obj: Any, raw_len: int) -> Dict[str, Any]:
    """Shape of a parsed FR dump: keys, pg_status, entry fields, timing fields filled."""
    if not isinstance(obj, dict):
        return {"type": type(obj).__name__}
    entries = obj.get("entries") or []
    fields: Dict[str, int] = {}
    for e in entries:
        for k in e:
            fields[k] = fields.get(k, 0) + 1
    sample = dict(entries[-1]) if entries else None
    if sample and "frames" in sample:
        sample["frames"] = (sample["frames"] or [])[:2]
    started = sum(1 for e in entries if e.get("time_discovered_started_ns"))
    states: Dict[str, int] = {}
    for e in entries:
        states[str(e.get("state"))] = states.get(str(e.get("state")), 0) + 1
    return {
        "bytes": raw_len,
        "keys": sorted(map(str, obj.keys())),
        "version": obj.get("version"),
        "comm_lib_version": obj.get("comm_lib_version", obj.get("nccl_version")),
        "pg_status": obj.get("pg_status"),
        "pg_config": obj.get("pg_config"),
        "n_entries": len(entries),
        "entry_fields": fields,
        "entries_with_time_discovered_started": started,
        "states": states,
        "durations_ms_filled": sum(1 for e in entries if e.get("duration_ms") is not None),
        "sample_entry": sample,
    }


def call_dump(fn: Callable[..., Any], args: tuple) -> tuple:
    start = time.monotonic()
    raw = fn(*args)
    ms = (time.monotonic() - start) * 1000
    if isinstance(raw, (bytes, bytearray)):
        try:
            obj = json.loads(raw)
        except Exception:
            obj = pickle.loads(raw)
    else:
        obj = json.loads(raw)
    return obj, len(raw), ms


def scenario_api(r: Rank) -> None:
    torch, dist, rec = r.torch, r.dist, r.rec
    r.init_group(0)
    t = torch.ones(256, device=r.device)
    with rec.step("2100 all_reduces of 1 KB + synchronize"):
        for _ in range(2100):
            dist.all_reduce(t)
        r.sync()
    if r.rank == 0:
        apis: Dict[str, Any] = {}
        for name in DUMP_NAMES:
            fn = getattr(r.c10d, name, None)
            info: Dict[str, Any] = {"exists": fn is not None}
            apis[name] = info
            if fn is None:
                continue
            info["doc"] = (fn.__doc__ or "").strip().splitlines()[0][:300]
            json_like = name.endswith("_json")
            variants = {  # the slow one (stack traces) last, so a slow symbolizer costs only itself
                "all": (True, False) if json_like else (True, False, False),
                "only_active": (True, True) if json_like else (True, False, True),
                "no_collectives": (False, False) if json_like else (False, False, False),
                "all_with_stacks": None if json_like else (True, True, False),
            }
            for label, args in variants.items():
                if args is None:
                    continue
                try:
                    obj, size, ms = call_dump(fn, args)
                    times = [ms] + ([call_dump(fn, args)[2] for _ in range(4)] if ms < 1000 else [])
                    info[label] = {"args": args, "ms_median_of_5": round(statistics.median(times), 3),
                                   "ms_all": [round(x, 3) for x in times], "shape": summarize_dump(obj, size)}
                except Exception as exc:
                    info[label] = {"args": args, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
                rec.set("apis", apis)
        rec.set("apis", apis)
        r.store.set(f"{r.scenario}/done", "1")
    else:
        rec.attempt("wait for rank 0's dumps", lambda: r.wait_key(f"{r.scenario}/done"))
    rec.attempt("destroy_process_group", lambda: dist.destroy_process_group())


def scenario_sleep_hang(r: Rank) -> None:
    torch, dist, rec = r.torch, r.dist, r.rec
    r.init_group(0)
    x = torch.zeros(MB_FLOATS, device=r.device)
    for phase in ("sync", "wait"):
        r.warmup(x, f"{phase}__base_seq", f"{phase}: ")
        stop = threading.Event()
        th = r.sampler(f"{phase}__samples", stop)
        if r.rank == 1:
            def before(i: int) -> None:
                if i == STUCK_AT:
                    with rec.step(f"{phase}: time.sleep before #{STUCK_AT}"):
                        time.sleep(2.0 if r.dry else 6.0)

            with rec.step(f"{phase}: loop"):
                r.loop(x, before)
            with rec.step(f"{phase}: synchronize"):
                r.sync()
        else:
            with rec.step(f"{phase}: enqueue {LOOP}"):
                works = r.loop(x)
            if phase == "sync":
                rec.attempt(f"{phase}: synchronize", r.sync)
            else:
                stuck = works[STUCK_AT - 1]
                rec.attempt(f"{phase}: work.wait()", lambda: stuck.wait())
                rec.attempt(f"{phase}: work.wait(timeout=60s)", lambda: stuck.wait(timedelta(seconds=60)))
                rec.attempt(f"{phase}: synchronize", r.sync)
        time.sleep(0.5)
        r.stop_sampler(f"{phase}__samples", stop, th)
    rec.attempt("destroy_process_group", lambda: dist.destroy_process_group())


def _after_abort_checks(r: Rank, works: List[Any]) -> None:
    """CUDA usable after an abort? And what the aborted work says about itself."""
    torch, rec = r.torch, r.rec
    stuck = works[STUCK_AT - 1]
    rec.attempt("stuck work.is_completed() after abort", lambda: bool(stuck.is_completed()))
    rec.attempt("stuck work.exception() after abort", lambda: repr(stuck.exception())[:400])

    def matmul() -> str:
        a = torch.randn(1024, 1024, device=r.device)
        b = a @ a
        r.sync()
        return f"ok sum={float(b.sum().item()):.3g}"

    rec.attempt("cuda matmul + synchronize after abort", matmul)


def _time_is_completed(r: Rank, works: List[Any]) -> None:
    rec = r.rec
    stuck, done = works[STUCK_AT - 1], works[STUCK_AT - 2]
    with rec.step("is_completed x200 on the stuck work (helper thread)", main=False) as entry:
        start = time.monotonic()
        values = [stuck.is_completed() for _ in range(200)]
        entry["us_per_call"] = round((time.monotonic() - start) / 200 * 1e6, 2)
        entry["values"] = sorted(set(values))
        entry["main_in"] = rec.main_in
    with rec.step("is_completed on the work before it", main=False) as entry:
        entry["value"] = done.is_completed()


def _abort_while_blocked(r: Rank, works: List[Any], label: str, abort: Callable[[], None],
                         sampling: tuple, before: Optional[Callable[[], None]] = None,
                         after: Optional[Callable[[], None]] = None) -> None:
    """The main thread blocks in synchronize() behind the stuck collective; 2.5 s later a helper
    thread times is_completed() and runs abort (with before/after around it). Then the sampler
    stops and CUDA is checked. Bounded: the helper is joined for 30 s, the rank by its parent."""
    rec = r.rec

    def helper() -> None:
        time.sleep(2.5)
        if before is not None:
            rec.attempt("full progress read before abort", before, main=False)
        with contextlib.suppress(Exception):
            _time_is_completed(r, works)
        rec.set("abort_started_t", rec.now())
        rec.attempt(label, abort, main=False)
        rec.set("abort_returned_t", rec.now())
        if after is not None:
            after()
        rec.attempt("progress read after abort", lambda: rec.set("snapshot_after_abort", r.read()), main=False)

    th = threading.Thread(target=helper, name="aborter", daemon=True)
    th.start()
    rec.attempt("synchronize behind the stuck collective", r.sync)
    rec.set("main_returned_t", rec.now())
    th.join(30)
    rec.set("aborter_alive_after_30s", th.is_alive())
    r.stop_sampler("samples", *sampling)
    _after_abort_checks(r, works)


def scenario_gpu_stuck(r: Rank) -> None:
    torch, dist, rec = r.torch, r.dist, r.rec
    if r.args.gen == 1:  # the replacement for the killed, GPU-stuck rank 1
        r.regroup()
        return
    x, stop, sampler = r.start_hang_scenario()
    if r.rank == 1:
        def before(i: int) -> None:
            if i == STUCK_AT and not r.dry:
                torch.cuda._sleep(GPU_SLEEP_CYCLES)

        with rec.step(f"loop with cuda._sleep before #{STUCK_AT}"):
            r.loop(x, before)

        def report() -> None:
            time.sleep(2.5)
            rec.attempt("full progress read (GPU-stuck rank, main in synchronize)",
                        lambda: rec.set("snapshot", r.read()), main=False)
            r.store.set(f"{r.scenario}/r1_dumped", "1")

        threading.Thread(target=report, name="reporter", daemon=True).start()
        rec.attempt("synchronize (never returns: killed by the parent)", r.sync)
        time.sleep(60)  # dry: the parent kills us
        return
    with rec.step(f"enqueue {LOOP}"):
        works = r.loop(x)
    _abort_while_blocked(r, works, "_abort_process_group() from helper thread",
                         lambda: dist.distributed_c10d._abort_process_group(), (stop, sampler),
                         before=lambda: rec.set("snapshot_before_abort", r.read()))
    rec.set("is_initialized_after_abort", dist.is_initialized())
    r.store.set(f"{r.scenario}/r0_ready_gen1", "1")
    r.regroup()


def scenario_cpu_hang(r: Rank) -> None:
    dist, rec = r.dist, r.rec
    x, stop, sampler = r.start_hang_scenario()
    pg = dist.distributed_c10d._get_default_group()
    if r.rank == 1:
        def before(i: int) -> None:
            if i == STUCK_AT:
                rec.attempt(f"CPU hang before #{STUCK_AT}: wait for rank 0's abort",
                            lambda: r.wait_key(f"{r.scenario}/r0_aborted"))
                raise StopIteration

        with contextlib.suppress(StopIteration):
            r.loop(x, before)
        rec.attempt("synchronize (50 completed)", r.sync)
        r.stop_sampler("samples", stop, sampler)
        rec.attempt("pg.abort() (peer already aborted)", pg.abort)
        rec.attempt("destroy_process_group after abort", lambda: dist.destroy_process_group())
    else:
        with rec.step(f"enqueue {LOOP}"):
            works = r.loop(x)
        _abort_while_blocked(r, works, "pg.abort() from helper thread", pg.abort, (stop, sampler),
                             after=lambda: r.store.set(f"{r.scenario}/r0_aborted", "1"))
        rec.attempt("destroy_process_group after abort", lambda: dist.destroy_process_group())
    r.regroup()


def scenario_peer_death(r: Rank) -> None:
    dist, rec = r.dist, r.rec
    r.init_group(0)
    r.warmup(r.torch.zeros(1024, device=r.device), "base_seq")
    if r.rank == 1:
        time.sleep(1.0)  # rank 0 is inside its all_reduce by then
        rec.set("finished", True)
        os._exit(0)
    t = r.torch.full((1024,), float(r.rank + 1), device=r.device)
    work = None

    def survivor_all_reduce() -> float:
        nonlocal work
        if r.scenario == "peer_death_wait":
            work = dist.all_reduce(t, async_op=True)
            work.wait()
        else:
            dist.all_reduce(t)
        return float(t[0].item())

    rec.attempt("all_reduce while the peer dies (3.0 with both)", survivor_all_reduce)
    time.sleep(2.0)
    if work is not None:
        rec.attempt("work.exception() 2 s later", lambda: repr(work.exception())[:400])
        rec.attempt("work.is_success() 2 s later", work.is_success)
    rec.attempt("next all_reduce (3.0 with both)", survivor_all_reduce)


WORKERS: Dict[str, Callable[[Rank], None]] = {
    "api_timing": scenario_api,
    "api_notiming": scenario_api,
    "sleep_hang": scenario_sleep_hang,
    "gpu_stuck": scenario_gpu_stuck,
    "cpu_hang": scenario_cpu_hang,
    **{name: scenario_peer_death for name in PEER_DEATH},
}


def worker_main(args: argparse.Namespace) -> int:
    r = Rank(args)
    try:
        WORKERS[args.worker](r)
        r.rec.set("finished", True)
        return 0
    except Exception:
        r.rec.set("fatal", traceback.format_exc()[-2000:])
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if r.rec.data.get("finished") else 1)  # never wait on NCCL's teardown at exit


# ----------------------------------------------------------------------------------------------
# parent side
# ----------------------------------------------------------------------------------------------
BASE_ENV = {
    "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_NVLS_ENABLE": "0",
    "NCCL_COLLNET_ENABLE": "0", "NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "WARN",
    "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0"),
}
SCENARIO_ENV = {
    "api_timing": {"TORCH_NCCL_ENABLE_TIMING": "1"},
    "api_notiming": {"TORCH_NCCL_ENABLE_TIMING": "0"},
    "sleep_hang": {"TORCH_NCCL_ENABLE_TIMING": "1"},
    "gpu_stuck": {"TORCH_NCCL_ENABLE_TIMING": "1"},  # ASYNC_ERROR_HANDLING: torch's default
    "cpu_hang": {"TORCH_NCCL_ENABLE_TIMING": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"},
    "peer_death_sync": {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"},
    "peer_death_wait": {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"},
    "peer_death_blocking": {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_BLOCKING_WAIT": "1"},
}
SCENARIO_TIMEOUT_S = {"api_timing": 50, "api_notiming": 40, "sleep_hang": 60, "gpu_stuck": 75, "cpu_hang": 60,
                      **{name: 30 for name in PEER_DEATH}}


class Parent:
    """Runs the scenarios as rank processes under one overall budget; kills what it started."""

    def __init__(self, args: argparse.Namespace) -> None:
        from torch.distributed import TCPStore

        self.args = args
        self.deadline = time.monotonic() + args.budget
        self.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=30))
        self.port = self.store.port
        self.tmp = tempfile.mkdtemp(prefix="nccl_probe_")
        self.procs: List[subprocess.Popen] = []

    def spawn(self, scenario: str, rank: int, gen: int, folder: str) -> subprocess.Popen:
        env = dict(os.environ, **BASE_ENV, **SCENARIO_ENV[scenario])
        env["NCCL_HOSTID"] = f"nccl-probe-host-{rank}"
        env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = os.path.join(folder, "fr_dump_")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", scenario, "--rank", str(rank),
               "--gen", str(gen), "--port", str(self.port),
               "--result", os.path.join(folder, f"rank{rank}_gen{gen}.json")]
        if self.args.dry:
            cmd.append("--dry")
        log = open(os.path.join(folder, f"rank{rank}_gen{gen}.log"), "w")
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        p.label = f"rank{rank}_gen{gen}"  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def kill(self, p: subprocess.Popen) -> Optional[float]:
        """SIGKILL p's session; seconds until it was reaped (None: not reaped within 30 s)."""
        if p.poll() is not None:
            return 0.0
        start = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        try:
            p.wait(30)
            return round(time.monotonic() - start, 3)
        except subprocess.TimeoutExpired:
            return None

    def kill_all(self) -> None:
        for p in self.procs:
            self.kill(p)

    def wait_keys(self, keys: List[str], deadline: float, watch: List[subprocess.Popen]) -> bool:
        while time.monotonic() < deadline:
            if self.store.check(keys):
                return True
            if any(p.poll() is not None for p in watch):
                return False
            time.sleep(0.1)
        return False

    def run(self, scenario: str) -> Dict[str, Any]:
        left = self.deadline - time.monotonic() - 5
        timeout = min(SCENARIO_TIMEOUT_S[scenario] * (0.5 if self.args.dry else 1), left)
        out: Dict[str, Any] = {"env": SCENARIO_ENV[scenario], "events": []}
        if timeout < 15:
            out["skipped"] = f"only {left:.0f} s of the budget left"
            return out
        folder = os.path.join(self.tmp, scenario)
        os.makedirs(folder)
        start = time.monotonic()
        deadline = start + timeout
        procs = [self.spawn(scenario, 0, 0, folder), self.spawn(scenario, 1, 0, folder)]

        def event(what: str, **kw: Any) -> None:
            out["events"].append(dict(t=round(time.monotonic() - start, 3), what=what, **kw))

        if scenario == "gpu_stuck":
            ready = self.wait_keys([f"{scenario}/r1_dumped", f"{scenario}/r0_ready_gen1"], deadline, procs)
            event("rank 1 dumped and rank 0 ready for gen1" if ready else "gave up waiting for gen1 readiness",
                  rcs=[p.poll() for p in procs])
            if ready:
                event("SIGKILL GPU-stuck rank 1", reaped_after_s=self.kill(procs[1]))
                procs.append(self.spawn(scenario, 1, 1, folder))
                event("replacement rank 1 started")
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                event(f"{p.label} still running at the deadline: SIGKILL",  # type: ignore[attr-defined]
                      reaped_after_s=self.kill(p))
        out["wall_s"] = round(time.monotonic() - start, 3)
        out["ranks"] = {}
        for p in procs:
            label = p.label  # type: ignore[attr-defined]
            rank_out: Dict[str, Any] = {"rc": p.returncode}
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(folder, f"{label}.json")) as f:
                    rank_out["record"] = json.load(f)
            with contextlib.suppress(OSError):
                with open(os.path.join(folder, f"{label}.log"), errors="replace") as f:
                    rank_out["log_tail"] = f.read()[-2500:]
            out["ranks"][label] = rank_out
        out["watchdog_dump_files"] = sorted(n for n in os.listdir(folder) if n.startswith("fr_dump_"))
        return out


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------
def _rec(res: Dict[str, Any], label: str) -> Dict[str, Any]:
    return ((res.get("ranks") or {}).get(label) or {}).get("record") or {}


def _steps(rec: Dict[str, Any]) -> Dict[str, Any]:
    return {s["name"]: {k: v for k, v in s.items() if k not in ("name",)} for s in rec.get("steps", [])}


def _blocked(main_in: str) -> bool:
    """Whether the main thread was inside a blocking call (synchronize, work.wait, sleep, key wait)."""
    return any(w in main_in for w in ("synchronize", "work.wait(", "time.sleep", "wait for"))


def _series(samples: List[Dict[str, Any]], base: Optional[int]) -> Dict[str, Any]:
    """Transitions of (enqueued, started, completed) seq (base: the seq before the loop), read latency."""
    changes, last = [], None
    for s in samples:
        st = s.get("status") or {}
        if not st:
            continue
        rel = progress(next(iter(st.values())))
        if rel != last:
            changes.append({"t": s["t"], "main_in": s.get("main_in"), "enq,started,completed": rel,
                            "first_active": (s.get("active") or {}).get("first", [None])[:1]})
            last = rel
    ms = [s["ms"] for s in samples if "ms" in s]
    blocked = [s["ms"] for s in samples if "ms" in s and _blocked(str(s.get("main_in")))]
    return {
        "base": base, "n": len(samples), "errors": sum(1 for s in samples if "error" in s),
        "transitions": changes[:12],
        "read_ms_median": round(statistics.median(ms), 3) if ms else None,
        "read_ms_max": round(max(ms), 3) if ms else None,
        "reads_while_main_blocked": len(blocked),
        "read_ms_max_while_main_blocked": round(max(blocked), 3) if blocked else None,
    }


def summarize(results: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for name in ("api_timing", "api_notiming"):
        res = results.get(name) or {}
        apis = _rec(res, "rank0_gen0").get("apis") or {}
        s: Dict[str, Any] = {}
        for api, info in apis.items():
            if not info.get("exists"):
                s[api] = "absent"
                continue
            row = {"doc": info.get("doc")}
            for label in ("all", "all_with_stacks", "only_active", "no_collectives"):
                v = info.get(label)
                if not v:
                    continue
                if "error" in v:
                    row[label] = v["error"]
                    continue
                sh = v["shape"]
                row[label] = {"ms": v["ms_median_of_5"], "bytes": sh.get("bytes"), "n_entries": sh.get("n_entries"),
                              "entries_started": sh.get("entries_with_time_discovered_started"),
                              "durations": sh.get("durations_ms_filled"), "states": sh.get("states")}
            full = (info.get("all") or {}).get("shape") or {}
            row["keys"] = full.get("keys")
            row["pg_status"] = full.get("pg_status")
            row["entry_fields"] = sorted(full.get("entry_fields") or {})
            s[api] = row
        steps = _steps(_rec(res, "rank0_gen0"))
        s["loop_2100_s"] = (steps.get("2100 all_reduces of 1 KB + synchronize") or {}).get("s")
        s["error"] = _rec(res, "rank0_gen0").get("fatal") or res.get("skipped")
        out[name] = s
    res = results.get("sleep_hang") or {}
    s = {}
    for label in ("rank0_gen0", "rank1_gen0"):
        rec = _rec(res, label)
        for phase in ("sync", "wait"):
            s[f"{label} {phase}"] = _series(rec.get(f"{phase}__samples") or [], rec.get(f"{phase}__base_seq"))
            s[f"{label} {phase}"]["sampler_hung"] = rec.get(f"{phase}__samples__sampler_hung")
        s[f"{label} steps"] = {k: (v.get("s"), v.get("error")) for k, v in _steps(rec).items()}
    out["sleep_hang"] = s
    for name in ("gpu_stuck", "cpu_hang", *PEER_DEATH):
        res = results.get(name) or {}
        s = {"events": res.get("events"), "watchdog_dump_files": res.get("watchdog_dump_files"),
             "skipped": res.get("skipped")}
        for label, rk in (res.get("ranks") or {}).items():
            rec = rk.get("record") or {}
            row = {"rc": rk.get("rc"), "fatal": (rec.get("fatal") or "")[-400:] or None,
                   "steps": {k: {kk: vv for kk, vv in v.items() if kk in ("s", "error", "result", "us_per_call",
                                                                        "values", "value", "correct", "main_in")}
                             for k, v in _steps(rec).items()}}
            if rec.get("samples"):
                row["progress"] = _series(rec["samples"], rec.get("base_seq"))
            for k in ("abort_started_t", "abort_returned_t", "main_returned_t", "aborter_alive_after_30s",
                      "is_initialized_after_abort"):
                if k in rec:
                    row[k] = rec[k]
            for k in ("snapshot", "snapshot_before_abort", "snapshot_after_abort"):
                if k in rec:
                    row[k] = rec[k]
            s[label] = row
        out[name] = s
    return out


def parent_main(args: argparse.Namespace) -> int:
    try:
        import torch
    except ImportError:
        print("error: torch is not importable; run this with the python that has torch", file=sys.stderr)
        return 2
    if not args.dry and not torch.cuda.is_available():
        print("error: CUDA is not available here; this probe needs one NVIDIA GPU "
              "(use --dry to check its control flow on CPU with gloo)", file=sys.stderr)
        return 2
    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        print(f"error: unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    parent = Parent(args)

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    results: Dict[str, Any] = {}
    report: Dict[str, Any] = {"argv": sys.argv, "dry": args.dry, "torch": torch.__version__,
                              "cuda_available": torch.cuda.is_available()}
    try:
        if torch.cuda.is_available():
            report["device"] = torch.cuda.get_device_name(0)
            with contextlib.suppress(Exception):
                report["nccl"] = nccl_version(torch)
        for scenario in chosen:
            print(f"== {scenario} ...", flush=True)
            try:
                results[scenario] = parent.run(scenario)
            except Exception:
                results[scenario] = {"parent_error": traceback.format_exc()[-1500:]}
            finally:
                parent.kill_all()
            print(f"   done in {results[scenario].get('wall_s')} s", flush=True)
    finally:
        parent.kill_all()
        report["results"] = results
        try:
            report["summary"] = summarize(results)
        except Exception:
            report["summary"] = {"summarize_error": traceback.format_exc()[-1500:]}
        text = json.dumps(report["summary"], indent=1, default=repr)
        print(text)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1, default=repr)
            print(f"full report: {args.json}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the full report (summary + raw rank records) here")
    ap.add_argument("--budget", type=float, default=230.0, help="overall seconds for every scenario (default 230)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}")
    ap.add_argument("--dry", action="store_true", help="gloo on CPU: checks the control flow, measures nothing NCCL")
    ap.add_argument("--worker", choices=list(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--gen", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.budget <= 0:
        ap.error("--budget must be a positive number of seconds")
    return worker_main(args) if args.worker else parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
