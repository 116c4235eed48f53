"""A snapshot of a run of ``rankguard run``, from its journal, its ranks' ledgers and /proc,
without touching it: each rank's state (in which collective, on which group, since when;
computing; exited), its process (running, sleeping, stopped), the ranks the others wait for,
restarts, the last fault, and a launcher that cannot act (stopped). Read-only: the ledgers are
mapped read-only, nothing is signalled.
"""

from __future__ import annotations

import glob
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from ..errors import UsageError
from ..records import ledger, private_files
from . import files, remote, runs


def _known(kind: str) -> str:
    """A ledger's operation name, "" for one whose kind is not known yet (``none``)."""
    return "" if kind == ledger.OP_NAMES[0] else kind


@dataclass(frozen=True)
class RankView:
    rank: int
    pid: int
    state: str  # waiting, computing, starting, exited
    process: str  # running, sleeping, stopped, zombie, gone
    op: str = ""  # the operation it waits in, or the last it completed; "" when not known
    seq: int = 0
    group: str = "world"
    since_s: float | None = None  # in that state for
    waited_for: bool = False  # the others wait for this rank
    node: str = ""  # another node's rank: ``node N (HOST)``; its process is not seen from here


@dataclass(frozen=True)
class StatusView:
    run_id: str
    attempt: int | None
    ended: bool
    restarts: int
    last_fault: str | None
    ranks: tuple[RankView, ...] = field(default_factory=tuple)
    nodes: str | None = None  # several nodes: where the others' ranks were read, what failed
    unfinished: str | None = None  # over without its run_end (``runs.Run.unfinished``)
    launcher: str | None = None  # its launcher cannot act now (stopped)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def snapshot(run: runs.Run) -> StatusView:
    """Where ``run`` stands now."""
    events = run.events
    restarts = sum(1 for e in events if e["event"] == "restart")
    last_fault = runs.last_fault(list(events))
    progress = _ledgers(run)
    now = time.monotonic()
    entries = {rank: g for rank, p in progress.items() if p is not None
               for g in p.groups if g.is_world}
    others = remote.read(list(events)) if not (run.ended or run.unfinished) else None
    far = others.ranks if others is not None else ()
    entries.update((r.rank, _world(r)) for r in far)
    waited_for: set[int] = set()
    if any(g.waiting for g in entries.values()):
        late, _ = ledger.behind(sorted({r.rank for r in run.ranks} | {r.rank for r in far}),
                                entries)
        waited_for = set(late)
    views = []
    world_size = len(run.ranks)
    for rank in run.ranks:
        process = _process(rank.pid) if rank.alive else "gone"
        mine = progress.get(rank.rank)
        slot = _current(mine.groups) if mine is not None else None
        marked = rank.rank in waited_for
        if not rank.alive:
            views.append(RankView(rank.rank, rank.pid, "exited", process))
        elif slot is None:
            views.append(RankView(rank.rank, rank.pid, "starting", process, waited_for=marked))
        else:
            group = "world" if slot.is_world else \
                f"ranks {','.join(map(str, slot.member_ranks(world_size)))}"
            entry = slot.current if slot.waiting else slot.done
            since = now - (slot.t_enter if slot.waiting else slot.t_done)
            views.append(RankView(rank.rank, rank.pid,
                                  "waiting" if slot.waiting else "computing", process,
                                  _known(slot.kind), slot.seq_at(entry), group,
                                  since if (slot.waiting or slot.t_done) else None, marked))
    for other in far:
        waiting = other.entered > other.done
        views.append(RankView(other.rank, 0, "waiting" if waiting else "computing", "",
                              _known(other.kind), ledger.seq_of(other.entered if waiting else other.done,
                                                        True), "world", None,
                              other.rank in waited_for,
                              f"node {other.node}" + (f" ({other.host})" if other.host else "")))
    views.sort(key=lambda view: view.rank)
    nodes = None
    if others is not None:
        nodes = f"other nodes' ranks from their beats in the round's store at {others.store}"
        if others.problem:
            nodes += f"; {others.problem}"
    return StatusView(run.run_id, run.attempt, run.ended, restarts, last_fault, tuple(views),
                      nodes, run.unfinished, _launcher_note(run))


def _launcher_note(run: runs.Run) -> str | None:
    """What to say of a live run's launcher that cannot act: stopped (SIGSTOP, or Ctrl-Z in
    its terminal), it watches no rank, judges no hang and restarts nothing."""
    pid = runs.live_launcher(run)
    if pid is None or _process(pid) != "stopped":
        return None
    return (f"its launcher (pid {pid}) is stopped (SIGSTOP, or Ctrl-Z in its terminal): it "
            f"watches no rank, judges no hang and restarts nothing until it is resumed "
            f"(kill -CONT {pid}, or fg in its terminal)")


def _world(other: remote.RemoteRank) -> ledger.GroupProgress:
    """Another node's rank's world group, as far as its beat tells (no times)."""
    return ledger.GroupProgress(ledger.group_key("world"), 0, True, 0, other.entered, other.done,
                                other.kind, 0.0, 0.0)


def _current(groups: tuple[ledger.GroupProgress, ...]) -> ledger.GroupProgress | None:
    """The group a rank is in now: the one it waits in (the latest entered), else its world
    group."""
    waiting = [g for g in groups if g.waiting]
    if waiting:
        return max(waiting, key=lambda g: g.t_enter)
    return next((g for g in groups if g.is_world), None)


def _ledgers(run: runs.Run) -> dict[int, ledger.RankProgress | None]:
    """Each rank's ledger of the run's current attempt, if it can still be read."""
    folders = sorted((folder for folder in glob.glob(os.path.join(
        ledger.default_dir(), f"rankguard-ledgers-{glob.escape(run.run_id)}-*"))
        if _private(folder)), key=lambda p: os.path.getmtime(p) if os.path.exists(p) else 0)
    found: dict[int, ledger.RankProgress | None] = {}
    for rank in run.ranks:
        found[rank.rank] = None
        for folder in reversed(folders):
            path = os.path.join(folder, f"attempt{run.attempt}-rank{rank.rank}.ledger")
            try:
                reader = ledger.LedgerReader(path)
            except ledger.LedgerError:
                continue
            try:
                progress = reader.read()
            finally:
                reader.close()
            if progress.pid in (0, rank.pid):
                found[rank.rank] = progress
                break
    return found


def _private(folder: str) -> bool:
    """Whether ``folder`` is a ledger folder as the launcher makes them (``ledger.make_dir``):
    the user's own, that only they can write. /dev/shm is everyone's: another user could
    name a folder after the run there and put a forged ledger, or a FIFO, in it."""
    try:
        private_files.check_private(folder, "ledger folder")
    except (UsageError, OSError):
        return False
    return True


def _process(pid: int) -> str:
    try:
        status = psutil.Process(pid).status()
    except psutil.Error:
        return "gone"
    return {psutil.STATUS_RUNNING: "running", psutil.STATUS_STOPPED: "stopped",
            psutil.STATUS_TRACING_STOP: "stopped", psutil.STATUS_ZOMBIE: "zombie",
            psutil.STATUS_DISK_SLEEP: "in I/O"}.get(status, "sleeping")


def render(view: StatusView) -> str:
    """The snapshot as a table for a terminal."""
    head = (f"run {view.run_id}  {runs.attempt_words(view.attempt)}  restarts {view.restarts}"
            f"{'  (ended)' if view.ended else ''}")
    lines = [head, f"{'rank':>4}  {'pid':>7}  {'state':<40} {'for':>8}  process"]
    for r in view.ranks:
        label = ledger.op_label(r.op or ledger.OP_NAMES[0], r.seq)
        if r.state == "waiting":
            what = f"waiting in {label} ({r.group})"
        elif r.state == "computing":
            # a group's first operation not entered yet: its slot says #-1
            what = f"computing, after {label}" if r.op or r.seq > 0 else "computing"
        else:
            what = r.state
        since = f"{r.since_s:.1f} s" if r.since_s is not None else ""
        mark = "  <- the others wait for it" if r.waited_for else ""
        pid = str(r.pid) if r.pid else "-"
        lines.append(f"{r.rank:>4}  {pid:>7}  {what:<40} {since:>8}  {r.node or r.process}"
                     f"{mark}")
    if view.nodes:
        lines.append(view.nodes)
    if view.last_fault:
        lines.append(f"last fault: {view.last_fault}")
    if view.unfinished:
        lines.append(f"the run is over: {view.unfinished}")
    if view.launcher:
        lines.append(view.launcher)
    return files.printable_lines("\n".join(lines))
