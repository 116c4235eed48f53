"""Stopping the ranks of an attempt: stacks first, then an escalation ladder, each step bounded.

0. **notice** (ranks in bounded mode only; between the two halves of step 1): the survivors'
   ledgers get a notice that a peer died or hung; a rank waiting in a bounded collective raises
   ``rankguard.PeerFailed`` within one wait slice, and its program may end on its own. Under
   ``--recovery in-place`` the notice carries the refusal (why the fault is not repaired in
   place): a ``rankguard.StepLoop`` then ends at once instead of waiting for a replacement. Bounded
   by the run's ``--grace``: a rank asked to stop by a notice gets as long to end as one asked
   by SIGTERM, so a budget that holds for the one holds for the other, on a loaded machine too.
1. **stacks**: every live rank whose stack handler is installed dumps all its threads' Python
   stacks to its stacks file (SIGUSR1, faulthandler; a stopped rank is continued so the handler
   runs). Bounded by ``margins.STACKS_S``. The running ranks dump first, then get the notice, and
   the stopped ones are continued only after it, so a frozen rank cannot slip into the
   collective its peers are being told to give up.
2. **term**: SIGTERM to each rank's process group and tree (stopped ones are continued so they
   receive it); wait up to ``grace`` for the exits, event-driven.
3. **kill**: SIGKILL to the process trees of the ranks still alive; wait up to
   ``margins.REAP_S``.
4. **verify**: find any process of the run still alive (its marker, or the launcher's
   ``proctree.Tracking`` for those that cleared their environment and detached) and kill it,
   journaled as ``leftover``.
"""

from __future__ import annotations

import signal

from ..records import ledger as _ledger
from .. import margins
from ..processes import proctree, stack_summary, stack_requests
from ..deadline import Deadline
from ..records.journal import Journal
from ..supervisor import RankProcess, RankProcesses
from .monitor import HangMonitor


def capture_stacks(ranks: RankProcesses, monitor: HangMonitor, stopped: bool) -> dict[int, str]:
    """Ask every live, ready rank that is ``stopped`` (or, with False, running) for its stacks,
    and wait for the dumps up to ``margins.STACKS_S``; returns rank -> file that holds them."""
    asked: dict[RankProcess, tuple[int, list[str]]] = {}
    snaps = monitor.snapshot()
    for member in ranks.live():
        if proctree.is_stopped(member.pid) != stopped:
            continue
        snap = snaps.get(member.rank)
        if snap is None or not snap.stacks_ready or snap.fault:
            continue  # not ready for the signal yet, or already on its way out
        asked[member] = (member.pid, [member.stacks_path])
    stack_requests.ask(asked, margins.STACKS_S, gone=lambda m: m.proc.poll() is not None)
    return {m.rank: m.stacks_path for m in asked if stack_requests.file_size(m.stacks_path) > 0}


def notify_survivors(ranks: RankProcesses, monitor: HangMonitor, journal: Journal,
                     culprits: set[int], kind: int, grace: float,
                     refusal: str | None = None) -> None:
    """Tell the live ranks in bounded mode, except ``culprits``, that a peer failed (and, with
    ``refusal``, why it will not be replaced); wait up to ``grace`` (the run's ``--grace``) for
    them to exit on their own. Returns as soon as they all have."""
    snaps = monitor.snapshot()
    told = {m.rank for m in ranks.live() if m.rank not in culprits and m.rank in snaps
            and snaps[m.rank].flags & _ledger.FLAG_BOUNDED}
    if not told:
        return
    failed = min(culprits) if culprits else -1
    said = None if refusal is None else \
        f"{f'rank {failed}' if failed >= 0 else 'the failed rank'} will not be replaced: {refusal}"
    for member in ranks.live():
        if member.rank in told:
            _ledger.post_notice(member.ledger_path, kind, failed, said)
    journal.write("escalate", step="notice", ranks=sorted(told),
                  reason=_ledger.NOTICE_NAMES[kind], attempt=ranks.number)
    ranks.wait_exits(Deadline.after(grace), told, grace=True)


def end_lingering(ranks: RankProcesses, member: RankProcess, ready: bool, grace: float
                  ) -> tuple[list[str], bool]:
    """End one rank whose script ended but whose process lingers (``outcome.lingering``): its
    stacks first (``ready``: its handler is installed; bounded by ``margins.STACKS_S``), then
    SIGTERM, ``grace``, SIGKILL (bounded by ``margins.REAP_S``). Returns where each of its
    threads was (``stack_summary.every_thread``; empty: no dump) and whether it needed the
    SIGKILL."""
    where: list[str] = []
    if ready:
        dumps = stack_requests.ask({member: (member.pid, [member.stacks_path])},
                                   margins.STACKS_S, gone=lambda m: m.proc.poll() is not None)
        where = stack_summary.every_thread(dumps.get(member, ""))
    ranks.signal(signal.SIGTERM, [member])
    if ranks.wait_exits(Deadline.after(grace), {member.rank}, grace=True):
        return where, False
    member.killed = True
    ranks.signal(signal.SIGKILL, [member])
    ranks.wait_exits(Deadline.after(margins.REAP_S), {member.rank})
    return where, True


def stop_ranks(ranks: RankProcesses, journal: Journal, grace: float, reason: str) -> None:
    """SIGTERM, wait ``grace``, SIGKILL; marks ranks that needed the kill."""
    live = ranks.live()
    if live:
        journal.write("escalate", step="term", ranks=[m.rank for m in live], reason=reason,
                      attempt=ranks.number)
        ranks.signal(signal.SIGTERM, live)
        ranks.wait_exits(Deadline.after(grace), grace=True)
    live = ranks.live()
    if live:
        journal.write("escalate", step="kill", ranks=[m.rank for m in live], reason=reason,
                      attempt=ranks.number)
        for member in live:
            member.killed = True
        ranks.signal(signal.SIGKILL, live)
        ranks.wait_exits(Deadline.after(margins.REAP_S))


def sweep(tracking: proctree.Tracking, journal: Journal, attempt: int,
          keep: tuple[int, ...] = ()) -> list[str]:
    """Kill every process of the run still alive but ``keep`` (the warm spares): those that
    carry the run's marker, and those that cleared it and detached, which ``tracking`` still
    holds (its cgroup, or the launcher as their subreaper); returns their descriptions."""
    leftovers = [pid for pid in tracking.processes() if pid not in keep]
    if not leftovers:
        return []
    described = [proctree.describe(pid) for pid in leftovers]
    proctree.kill_and_reap(leftovers, margins.REAP_S)
    journal.write("leftover", attempt=attempt, processes=described)
    return described
