"""Hang and straggler detection: compare the ranks' ledgers, then look at the absent ranks.

For each process group, the ranks that have been waiting in an operation with no ledger event
for ``hang_timeout`` are candidates; the operation they wait in is the highest entry number
among them, and the candidates that entered it are the *waiters*. Members that have not entered
it are *absent*:

- an absent rank that is stopped (SIGSTOP), or made no progress (see ``progress``) for
  ``hang_timeout``, is **hung**;
- an absent rank that is busy (progressed in the last ``BUSY_RECENT_S``) is a **straggler**:
  reported once, and blamed as hung only when the waiters have waited ``straggler_timeout``;
- when every member entered the operation number but not the same operation (rank 0 in
  ``recv``, rank 1 in ``barrier``), they can never meet: a **mismatch**, blamed on the ranks in
  the minority's operations (on all of them when no operation has a majority);
- when every member entered the operation and it still does not complete ``hang_timeout``
  after the last one arrived, the stopped or idle members are blamed (all of them if none
  stands out).

An **asynchronous** group (NCCL: a rank's CPU returns at enqueue, far ahead of its device)
is judged by what each member enqueued, started on its device and completed
(``GroupProgress.asynchronous``). The operation the group is blocked in is the first that no
member completed, ``k``, when a member enqueued it (a member whose record lags behind a
completion another member saw is not what the group waits for); the members that enqueued it
wait, for as long as their completions have not moved. Then, once they waited ``hang_timeout``:

- a member that never **enqueued** ``k`` is absent, judged as above (hung, stopped, or a busy
  straggler);
- else, once every member's last enqueue is ``hang_timeout`` old, a member whose device never
  **started** ``k`` (its started count known and below ``k``) is blamed (``never_started``: a
  kernel before it is stuck);
- else a stopped member is blamed (its CPU drives the collective's network side);
- else every waiter **started** it and none completed it: the group is stuck inside the
  collective, NCCL or the network (``never_completed``; ``stuck_in_collective`` when started
  is not known, timing off).

A group one of whose members has left or recorded a fault of its own (it raised, is exiting,
got SIGTERM) is not judged here: that fault is (``outcome.first_fault``), and the waiting
members are its victims, not hung.

The rules are pure (``HangRules.judge``: ledgers, each process's ``Activity`` and ``now`` in,
verdicts out) and so are table-tested over plain snapshots; ``ReportedOnce`` passes each
straggler report on once; ``HangMonitor`` feeds them from the ledgers and /proc.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Collection, Iterable, Literal, Mapping

from ..records.ledger import (FAULT_NONE, GroupProgress, LedgerReader, RankProgress, behind,
                              op_label, seq_of)
from ..records.ledger import group_label as ledger_group_label
from .progress import ProgressTracker

# An absent rank counts as busy (a straggler) only if it made progress this recently; one that
# went quiet less than --hang-timeout ago is neither busy nor hung yet.
BUSY_RECENT_S = 0.5
# Point-to-point operations: a send meets a recv, so they are one kind when matching operations.
P2P = frozenset({"send", "recv", "recv_anysource"})


def group_label(group: GroupProgress) -> str:
    """``world``, ``world/gloo``, or ``ranks 0,2`` for a sub-group (the ledger knows its
    members, not its name: ``ledger.group_label``)."""
    return ledger_group_label(group.key, group.is_world,
                              (r for r in range(64) if group.members >> r & 1))


# Why a verdict blames its ranks. never_started and never_completed are an asynchronous
# group's (NCCL): enqueued but not started on the device; started and never completed.
Reason = Literal["stopped", "no_progress", "straggler_timeout", "busy", "stuck_in_collective",
                 "mismatch", "collective_deadline", "never_started", "never_completed"]


@dataclass(frozen=True)
class Verdict:
    """A finding about one operation of one group: a straggler report or a hang."""

    hung: bool
    blamed: tuple[int, ...]
    waiting: tuple[int, ...]
    op: str
    seq: int
    waited_s: float
    reason: Reason
    group_key: int = 0
    group: str = "world"  # see group_label
    ops: tuple[tuple[int, str], ...] = ()  # a mismatch: (rank, the operation it is in)
    # blamed ranks waiting in an operation of another group, or in an earlier one of this
    # group: (rank, its op_label)
    elsewhere: tuple[tuple[int, str], ...] = ()
    inside: bool = False  # the blamed ranks entered the operation (stopped inside it)
    doing: str = ""  # a straggler: what its process was seen doing ("waits for child 4717")
    # an asynchronous group's (NCCL): absent ranks never enqueued the operation
    asynchronous: bool = False
    members: tuple[int, ...] = ()  # a sub-group's ranks (empty: the world group)
    on_host: bool = False  # an asynchronous group whose operations run on the host (gloo)

    @property
    def op_label(self) -> str:
        """``all_reduce #57``, ``init_process_group``, ``barrier #3 on group ranks 0,2``."""
        return op_label(self.op, self.seq, self.group)

    def record(self) -> dict[str, Any]:
        """The verdict as plain JSON values (``from_record`` turns it back)."""
        return asdict(self)

    @classmethod
    def from_record(cls, fields: Any) -> Verdict | None:
        """The verdict of ``record()``'s ``fields``; None for anything that is not one."""
        try:
            verdict = cls(**{**fields, "blamed": tuple(fields["blamed"]),
                             "waiting": tuple(fields["waiting"]),
                             "members": tuple(int(r) for r in fields.get("members", ())),
                             "ops": tuple((int(r), str(o)) for r, o in fields.get("ops", ())),
                             "elsewhere": tuple((int(r), str(o))
                                                for r, o in fields.get("elsewhere", ()))})
            verdict.describe()
        except (TypeError, KeyError, ValueError, AttributeError):
            return None
        return verdict

    def describe(self) -> str:
        """The verdict in one line for people (the terminal, the summary)."""
        blamed = _ranks(self.blamed)
        waiters = _ranks(self.waiting)
        if self.reason == "mismatch":
            by_op: dict[str, list[int]] = {}
            for rank, op in self.ops:
                by_op.setdefault(op, []).append(rank)
            where = ", ".join(f"{_ranks(tuple(ranks))} in {op}" for op, ranks in by_op.items())
            return (f"mismatched operations #{self.seq} on group {self.group}: {where}; they "
                    f"can never complete; blamed: {blamed}; waited {self.waited_s:.1f} s")
        on_group = f"{op_label(self.op, self.seq)} on group {self.group}"
        if self.reason == "never_started":
            gpus = "its GPU" if len(self.blamed) == 1 else "their GPUs"
            waited = f"{waiters} waited" if self.waiting else "waited"
            return (f"{blamed} enqueued {on_group} but {gpus} never started it: a kernel "
                    f"before it is stuck; {waited} {self.waited_s:.1f} s")
        if self.reason == "never_completed":
            return (f"{blamed} started {on_group} on the GPU but none completed it: stuck "
                    f"inside the collective (NCCL or the network); waited "
                    f"{self.waited_s:.1f} s")
        if self.reason == "stuck_in_collective" and self.asynchronous and self.on_host:
            return (f"{blamed} enqueued {on_group} but none completed it: stuck inside the "
                    f"collective (gloo or the network); waited {self.waited_s:.1f} s")
        if self.reason == "stuck_in_collective" and self.asynchronous:
            return (f"{blamed} enqueued {on_group} but none completed it (whether a GPU "
                    f"started it is not known: TORCH_NCCL_ENABLE_TIMING is off); waited "
                    f"{self.waited_s:.1f} s")
        if self.reason == "stuck_in_collective":
            return (f"{blamed} entered {self.op_label} but it never completed; "
                    f"{waiters} waited {self.waited_s:.1f} s")
        what = {"stopped": "stopped (SIGSTOP)", "no_progress": "made no progress",
                "busy": "busy", "straggler_timeout": "busy past --straggler-timeout",
                "collective_deadline": "named by a rank that gave up waiting for it"}
        where = "".join(f"; rank {rank} is in {label}" for rank, label in self.elsewhere)
        state = what[self.reason] + (f": {self.doing}" if self.doing else "")
        if self.inside:
            waited = f"{waiters} waited" if self.waiting else "waited"
            return (f"{blamed} {'was' if len(self.blamed) == 1 else 'were'} stopped (SIGSTOP) "
                    f"inside {self.op_label}; {waited} {self.waited_s:.1f} s{where}")
        reached = "enqueued" if self.asynchronous else "reached"
        return (f"{blamed} never {reached} {self.op_label} ({state}); "
                f"{waiters} waited {self.waited_s:.1f} s{where}")


def _ranks(ranks: tuple[int, ...]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def _elsewhere(ranks: list[int], key: int, target: int,
               snaps: Mapping[int, RankProgress]) -> tuple[tuple[int, str], ...]:
    """Of ``ranks``, those waiting in an operation of another group than ``key``, or in one of
    group ``key`` before its entry ``target`` (one the others got past: what it waits for may
    be a peer on another node, or its completion is not recorded yet), with that operation."""
    found = []
    for rank in ranks:
        snap = snaps.get(rank)
        for group in snap.groups if snap is not None else ():
            if group.waiting and (group.key != key or group.current < target):
                found.append((rank, op_label(group.kind, group.seq, group_label(group))))
    return tuple(found)


def mismatched(ops: tuple[tuple[int, str], ...]) -> list[int]:
    """Of ranks that are each in an operation of the same number on one group, ``(rank, op)``,
    those to blame when the operations differ: the ranks outside the operation most of them
    are in, or all of them when none has a majority. Empty when they all match (a send and a
    recv match)."""
    by_kind: dict[str, list[int]] = {}
    for rank, op in ops:
        by_kind.setdefault("p2p" if op in P2P else op, []).append(rank)
    if len(by_kind) < 2:
        return []
    sizes = sorted((len(ranks) for ranks in by_kind.values()), reverse=True)
    if sizes[0] == sizes[1]:
        return sorted(rank for rank, _ in ops)
    majority = max(by_kind.values(), key=len)
    return sorted(rank for rank, _ in ops if rank not in majority)


@dataclass(frozen=True)
class Activity:
    """What one rank's process was seen doing, as of one moment (``progress`` samples it)."""

    idle_s: float  # seconds since the process last made progress
    stopped: bool = False  # stopped (SIGSTOP) or traced
    doing: str = ""  # what it was last seen doing, for people (``progress.Evidence.why``)


@dataclass(frozen=True)
class HangRules:
    """The hang and straggler rules of the module doc, as a pure function of what was seen.

    Nothing here reads a clock, a file or /proc: ``judge`` takes the ledgers, the processes'
    activity and ``now`` (the monotonic time the ledgers' times are on), and returns verdicts.
    """

    world_size: int
    hang_timeout: float
    straggler_timeout: float

    def judge(self, snaps: Mapping[int, RankProgress], activity: Mapping[int, Activity],
              gone: Collection[int], now: float) -> list[Verdict]:
        """Every group's verdict at ``now``, hangs first: those blaming ranks that wait in no
        other group before those that do, each the longest wait first; then straggler
        reports.

        Args:
            snaps: the ledger of every live rank (the ranks judged: a member without one is
                not counted on).
            activity: for every rank of ``snaps``.
            gone: ranks whose process exited; a group with such a member is not judged, nor
                one with a member whose ledger records a fault of its own.
            now: on the clock of the ledgers' times.
        """
        by_group: dict[int, dict[int, GroupProgress]] = {}
        for rank, snap in snaps.items():
            for group in snap.groups:
                by_group.setdefault(group.key, {})[rank] = group
        faulty = set(gone) | {rank for rank, snap in snaps.items() if snap.fault != FAULT_NONE}
        verdicts = []
        for key, entries in by_group.items():
            sample = next(iter(entries.values()))
            if faulty.intersection(sample.member_ranks(self.world_size)):
                continue  # a member left or failed: its fault decides, not a hang
            verdict = self._judge_group(key, entries, snaps, activity, now)
            if verdict is not None:
                verdicts.append(verdict)
        # A rank blamed in one group while it waits in another is more likely held up there:
        # hangs that blame ranks waiting nowhere come first. Then the longest wait: a rank
        # that stopped holds up its next operation first, and the peers that went on reach its
        # later ones later (a DeviceMesh's other dimension), in whatever order the groups come.
        verdicts.sort(key=lambda v: (not v.hung, bool(v.elsewhere), -v.waited_s))
        return verdicts

    def _sync_wait(self, entries: dict[int, GroupProgress], now: float
                   ) -> tuple[int, list[int], float, float] | None:
        """A synchronous group's wait: (the entry waited in, its waiters, how long they
        waited, when the first began), or None when no member waited ``hang_timeout``."""
        waiters = [r for r, g in entries.items()
                   if g.waiting and now - g.last_event >= self.hang_timeout]
        if not waiters:
            return None
        # A rank behind another one's operation is not waiting on the others (they got past
        # its operation, which it merely has not recorded as done, e.g. frozen before its next
        # one), however much longer it has been in it: its verdict comes when the ones ahead
        # have waited long enough, and names the operation it never reached.
        target = max(g.entered for g in entries.values() if g.waiting)
        if not any(entries[r].entered == target for r in waiters):
            return None
        # every rank in the operation waits in it, those that entered it last included
        waiters = [r for r, g in entries.items() if g.waiting and g.entered == target]
        return (target, waiters, max(now - entries[r].last_event for r in waiters),
                min(entries[r].t_enter for r in waiters))

    def _async_wait(self, entries: dict[int, GroupProgress], now: float
                    ) -> tuple[int, list[int], float, float] | None:
        """An asynchronous group's wait (see the module doc), as ``_sync_wait`` gives it: the
        first operation no member completed, the members that enqueued it, and how long since
        their completions last moved."""
        target = max(g.done for g in entries.values()) + 1
        waiters = [r for r, g in entries.items() if g.entered >= target]
        if not waiters:
            return None
        waited = max(now - entries[r].t_done for r in waiters)
        if waited < self.hang_timeout:
            return None
        return target, waiters, waited, min(entries[r].t_done for r in waiters)

    def _judge_group(self, key: int, entries: dict[int, GroupProgress],
                     snaps: Mapping[int, RankProgress], activity: Mapping[int, Activity],
                     now: float) -> Verdict | None:
        asynchronous = next(iter(entries.values())).asynchronous
        found = (self._async_wait if asynchronous else self._sync_wait)(entries, now)
        if found is None:
            return None
        target, waiters, waited, began = found
        sample = entries[waiters[0]]
        members = [r for r in sample.member_ranks(self.world_size) if r in snaps]
        kind = sample.kind
        seq = target if asynchronous else seq_of(target, sample.is_world)
        absent, _ = behind(members, entries, target)
        if absent:
            # A process that took its rank after the waiters began to wait cannot be what they
            # wait for: it replaced a rank of a generation since retired, whose wait another
            # node's beat can still show for a moment while this node's replacements count anew.
            absent = [r for r in absent if snaps[r].t_start <= began]
            if not absent:
                return None

        def stopped(ranks: list[int]) -> list[int]:
            return [r for r in ranks if activity[r].stopped]

        def idle(ranks: list[int]) -> list[int]:
            return [r for r in ranks if activity[r].idle_s >= self.hang_timeout]

        def verdict(hung: bool, blamed: list[int], reason: Reason,
                    ops: tuple[tuple[int, str], ...] = (), inside: bool = False) -> Verdict:
            waiting = [r for r in waiters if r not in blamed] if inside else waiters
            doing = "; ".join(activity[r].doing for r in sorted(blamed) if activity[r].doing)
            return Verdict(hung, tuple(sorted(blamed)), tuple(sorted(waiting)), kind, seq,
                           round(waited, 3), reason, key, group_label(sample), ops,
                           _elsewhere(sorted(blamed), key, target, snaps), inside,
                           doing if reason in ("busy", "straggler_timeout") else "",
                           asynchronous,
                           () if sample.is_world else tuple(sample.member_ranks(self.world_size)),
                           sample.on_host)

        if not absent and asynchronous:
            if now - max(entries[r].t_enter for r in members) < self.hang_timeout:
                return None  # a member enqueued lately: its device may not have caught up
            idle_gpus = [r for r in waiters if 0 <= entries[r].started < target]
            if idle_gpus:
                return verdict(True, idle_gpus, "never_started", inside=True)
            if stopped(members):
                return verdict(True, stopped(members), "stopped", inside=True)
            known = all(entries[r].started >= 0 for r in waiters)
            return verdict(True, waiters, "never_completed" if known else "stuck_in_collective")
        if not absent:
            ops = tuple((r, entries[r].kind) for r in members if entries[r].entered == target)
            odd = mismatched(ops)
            if odd:
                return verdict(True, odd, "mismatch", ops)
            last_arrival = max(entries[r].t_enter for r in members if r in entries)
            if now - last_arrival < self.hang_timeout:
                return None  # the last rank arrived only now: give the operation time to end
            if stopped(members):
                return verdict(True, stopped(members), "stopped", inside=True)
            quiet = idle([r for r in members if r not in waiters])
            return verdict(True, quiet or members, "stuck_in_collective")
        if stopped(absent):
            return verdict(True, stopped(absent), "stopped")
        frozen = idle(absent)
        if frozen:
            return verdict(True, frozen, "no_progress")
        if waited >= self.straggler_timeout:
            return verdict(True, absent, "straggler_timeout")
        busy = [r for r in absent if activity[r].idle_s <= BUSY_RECENT_S]
        if busy:
            return verdict(False, busy, "busy")
        return None  # went quiet only lately: frozen or not, the next checks will tell


@dataclass
class ReportedOnce:
    """The reporting-once rule: a hang is passed on at every check (the agent acts on the
    first one), a straggler report once per group, operation and first blamed rank."""

    _seen: set[tuple[int, int, int]] = field(default_factory=set)

    def new(self, verdicts: Iterable[Verdict]) -> list[Verdict]:
        """Of ``verdicts``, in their order, the hangs and the reports not passed on before."""
        fresh = []
        for verdict in verdicts:
            mark = (verdict.group_key, verdict.seq, verdict.blamed[0] if verdict.blamed else -1)
            if verdict.hung or mark not in self._seen:
                self._seen.add(mark)
                fresh.append(verdict)
        return fresh


@dataclass
class HangMonitor:
    """Reads every live rank's ledger and samples its process on each ``check``, and returns
    the new verdicts of ``HangRules``."""

    world_size: int
    hang_timeout: float
    straggler_timeout: float
    progress: ProgressTracker = field(default_factory=ProgressTracker)
    _readers: dict[int, LedgerReader] = field(default_factory=dict)
    _reported: ReportedOnce = field(default_factory=ReportedOnce)
    _gone: set[int] = field(default_factory=set)  # ranks whose process exited

    def __post_init__(self) -> None:
        # a main thread that wakes more often than the hang timeout is polling, not frozen
        self.progress.poll_s = self.hang_timeout

    @property
    def rules(self) -> HangRules:
        return HangRules(self.world_size, self.hang_timeout, self.straggler_timeout)

    def watch(self, rank: int, pid: int, reader: LedgerReader, now: float) -> None:
        """Watch ``rank`` (process ``pid``, a replacement's after one that exited)."""
        self._readers[rank] = reader
        self._gone.discard(rank)
        self.progress.start(rank, pid, now)

    def unwatch(self, rank: int) -> None:
        """Stop watching ``rank``: its process exited."""
        self._readers.pop(rank, None)
        self._gone.add(rank)
        self.progress.forget(rank)

    def snapshot(self) -> dict[int, RankProgress]:
        return {rank: reader.read() for rank, reader in self._readers.items()}

    def check(self, now: float, snaps: dict[int, RankProgress] | None = None,
              remote: Mapping[int, RankProgress] | None = None,
              remote_activity: Activity = Activity(0.0)) -> list[Verdict]:
        """Sample progress, compare ledgers (``snaps``: the watched ranks' ledgers as just read,
        by default read here); stragglers are returned once, hangs every time, hangs first.

        ``remote``: ranks this monitor does not watch (another node's), judged beside the
        watched ones with ``remote_activity`` for their processes."""
        snaps = self.snapshot() if snaps is None else snaps
        self.progress.sample(now, snaps)
        activity = {rank: Activity(self.progress.idle_for(rank, now),
                                   self.progress.stopped(rank), self.progress.doing(rank))
                    for rank in snaps}
        if remote:
            snaps = {**remote, **snaps}
            activity.update((rank, remote_activity) for rank in remote if rank not in activity)
        return self._reported.new(self.rules.judge(snaps, activity, self._gone, now))
