"""Asynchronous process groups (NCCL) in the progress ledger, read from torch's Flight Recorder.

rankguard leaves an NCCL group as torch made it (no wrapper: libraries reach for its
``ProcessGroupNCCL``, see ``instrument``), and its CPU returns from a collective once it is
enqueued, long before the device runs it. What the ledger needs of it, torch already counts in
C++ for every group: the last operation enqueued, started on the device and completed
(``fr_progress``). One daemon thread of the rank, the sampler, reads those counts every
:func:`tick_for` seconds and publishes each group's in its ledger slot, flagged asynchronous, so
the launcher's hang rules judge it by them (``launcher.monitor``). The thread that issues the
operations does nothing more per operation: the cost of watching an NCCL group is one read of a
few microseconds per tick, off that thread.

The sampler also writes each group's recent operations into the slot's ring, from the
recorder's entries it reads when a group stalls, before anything aborts it, and at the rank's
clean exit (``fr_recent``), for ``rankguard report``.

A slot's times are when the sampler saw its counts move, so they are up to a tick (plus torch's
own lag, about 0.2 s on NCCL) late. The kind of operation a group waits in is read only when its
completions have not moved for ``margins.ASYNC_STALL_S`` while one is pending (reading the
pending entries costs about 1 ms with 50 of them); so is how far the group really got, which on
gloo torch's completed count may understate (``fr_progress.completed_upto``).

Groups are found by torch's group id in the recorder (``pg_id``); the first time one appears the
sampler reads the recorder's entries once to learn its name and whether it is the default group
(``default_pg``), and torch.distributed's registry for its members. The default group takes the
ledger's world slot (a newer default group, after ``destroy_process_group``, takes it over);
every other group a sub-group slot of its own; the gloo half of a mixed group
(``cpu:gloo,cuda:nccl``) one beside its NCCL half's (``recorder_slots``).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from ..records import ledger as _ledger
from ..records import ledger_ring
from ..inputs import options
from ..margins import ASYNC_STALL_S
from . import fr_progress, fr_recent, nccl_abort, recorder_slots
from .fr_progress import (Entry, FlightRecorderReader, FlightRecorderUnavailable, GroupCounts,
                          Recorder)
from .state import WORLD

MIN_TICK_S = 0.05
MAX_TICK_S = 0.2  # torch's own counts lag about this much on NCCL: reading faster gains nothing
STOP_WAIT_S = 1.0  # how long stopping waits for the sampler's last tick
NONE = _ledger.OP_CODES["none"]


def tick_for(lag: float) -> float:
    """The sampler's period when completions may reach the ledger ``lag`` seconds late
    (``completions.lag_for``: a share of the launcher's hang timeout)."""
    return max(MIN_TICK_S, min(MAX_TICK_S, lag))


@dataclass(frozen=True)
class Published:
    """What the sampler last published for one group: torch's counts (``enqueued`` and
    ``completed`` from 0, ``started`` -1 when not known), when the first and the last of them
    last moved, and the kind of operation the group waits in with the number it is for."""

    enqueued: int
    started: int
    completed: int
    t_enter: float
    t_done: float
    kind: int = NONE
    # the operation ``kind`` is the kind of (0: none): the first one the recorder's entries show
    # not completed, at or past ``pending``
    kind_of: int = 0
    pending_since: float = 0.0  # since when the rank waits for :attr:`pending` (0.0: none)
    # the last operation the recorder's entries showed completed with every one before it (0:
    # not read): ``completed`` is never less (torch's gloo count may be, see fr_progress)
    retired: int = 0
    read_at: int = 0  # the enqueued count when the entries were last read for this group

    @property
    def pending(self) -> int:
        """The first operation not completed, while one is enqueued; else 0."""
        return self.completed + 1 if self.enqueued > self.completed else 0


def advance(before: Published | None, counts: GroupCounts, timing: bool, now: float
            ) -> Published:
    """The group's record after the recorder said ``counts`` at ``now``: times move only where
    the counts moved (a group seen for the first time has both at ``now``). torch says -1 for
    "none"; with ``timing`` on (``TORCH_NCCL_ENABLE_TIMING``) a started count of -1 means none
    started yet (0), without it, not known (-1). The completed count is never less than what
    the entries showed (``retired``) while the group is the same (its enqueued count did not go
    back), and so is the count at which they were read. Pure."""
    enqueued = max(counts.enqueued, 0)
    same = before is not None and enqueued >= before.enqueued  # else a new group in the slot
    retired = before.retired if same else 0
    completed = min(max(counts.completed, 0, retired), enqueued)
    started = max(counts.started, 0) if timing else -1
    pending = completed + 1 if enqueued > completed else 0
    if before is None:
        return Published(enqueued, started, completed, now, now,
                         pending_since=now if pending else 0.0)
    since = before.pending_since if pending == before.pending else (now if pending else 0.0)
    return replace(before, enqueued=enqueued, started=started, completed=completed,
                   t_enter=now if enqueued != before.enqueued else before.t_enter,
                   t_done=now if completed != before.completed else before.t_done,
                   pending_since=since, retired=retired, read_at=before.read_at if same else 0)


def with_retired(record: Published, retired: int | None, now: float) -> Published:
    """The group's record at ``now`` once the recorder's entries showed every operation up to
    ``retired`` completed (``fr_progress.completed_upto`` or ``completed_in_order``; None: the
    group has no entry there): its completed count is raised to it (never past the enqueued
    count, which the entries, read later, may be ahead of). The times of the counts stay: they
    are when torch's counts last moved. A rank still waiting in the same operation waits since
    it began to; one now seen waiting in a later operation waits since ``now``: it began to
    after the earlier one completed, which the entries do not date, and an older time would
    make it look as if it had waited longer than the peer that holds everyone up (a 2x2 mesh
    on a loaded machine blamed the victim's peer so). Pure."""
    if retired is None or retired <= record.retired:
        return record
    completed = min(max(record.completed, retired), record.enqueued)
    pending = completed + 1 if record.enqueued > completed else 0
    since = record.pending_since if pending == record.pending else (now if pending else 0.0)
    return replace(record, completed=completed, retired=retired, pending_since=since)


def overdue(record: Published, now: float, per_op_s: float | None,
            limit_at: float | None) -> bool:
    """Whether the operation the group waits in has passed its deadline: waited ``per_op_s``
    (the job-wide collective timeout) since it became the first pending, or the deadline at
    ``limit_at`` (a ``rankguard.deadline()`` block of the main thread) passed while it is
    pending. None: no such deadline. Pure."""
    if not record.pending:
        return False
    if per_op_s is not None and now - record.pending_since >= per_op_s:
        return True
    return limit_at is not None and now >= limit_at


def kind_wanted(record: Published, now: float) -> int:
    """The operation whose kind the sampler should learn now (0: none): the one the group
    waits in, once its completions have not moved for ``ASYNC_STALL_S`` and its kind is not
    known yet (``kind_of`` may be past ``pending``: torch's completed count lags its entries,
    and the entries tell which operation is really waited in), or operations were enqueued
    since the entries were last read (on NCCL, one of them completing shows the pending one
    done: see ``fr_progress.completed_in_order``). Pure."""
    pending = record.pending
    if pending and (record.kind_of < pending or record.enqueued > record.read_at) \
            and now - record.t_done >= ASYNC_STALL_S:
        return pending
    return 0


@dataclass
class _Bound:
    """A group of a recorder, the ledger slot it publishes to, its name as probes and errors
    give it (``world`` for the default group, else torch's) and its members (global ranks;
    empty for the world: every rank), and whether its operations run on the host (gloo)."""

    slot: _ledger._SlotWriter
    is_world: bool
    name: str
    ranks: tuple[int, ...] = ()
    on_host: bool = False
    record: Published | None = None
    overdue: bool = False  # its deadline passed once: reported, not again
    times: fr_recent.CompletionTimes = field(init=False)  # when its completions were seen

    def __post_init__(self) -> None:
        self.times = fr_recent.CompletionTimes(fr_recent.capacity(self.is_world))


@dataclass(frozen=True)
class Overdue:
    """An operation of an asynchronous group that passed its deadline (``overdue``): the
    group's name (``world``, or torch's) and members (empty: every rank), the operation's kind
    and number, and how long the rank waited for it."""

    group: str
    ranks: tuple[int, ...]
    is_world: bool
    op: str
    seq: int
    waited_s: float
    recorder: Recorder


Deadlines = Callable[[], tuple["float | None", "float | None"]]  # (per operation s, limit_at)


class AsyncGroupSampler:
    """Publishes the progress of every group of ``readers`` in ``ledger`` (the module doc).

    :meth:`sample` is one tick; :meth:`start` runs it every ``tick_s`` on a daemon thread,
    which :meth:`stop` ends (bounded by ``STOP_WAIT_S``). Nothing it calls waits on a group,
    a device or a peer.
    """

    def __init__(self, ledger: _ledger.LedgerWriter, readers: Sequence[FlightRecorderReader],
                 tick_s: float, timing: bool, members: Callable[[str], list[int] | None],
                 clock: Callable[[], float] = time.monotonic,
                 deadlines: Deadlines | None = None,
                 on_overdue: Callable[[Overdue], None] | None = None,
                 on_notice: Callable[[tuple[str, int], Overdue | None], None] | None = None,
                 gloo_watched: bool = True,
                 mixed: Callable[[], set[str]] = set) -> None:
        """``members``: the global ranks of the group torch names so (None: not known yet);
        ``timing``: whether the device's start of each operation is recorded; ``deadlines``:
        the deadlines in force now, (seconds per operation, a monotonic instant), each None
        when there is none; ``on_overdue``: called, on the sampler's thread and outside its
        tick, for each operation that passed one (once per group); ``on_notice``: called once
        per notice, the same way, when the supervisor posts one in the ledger (a peer died or
        hung), with it and the operation this rank waits in (None: none); ``gloo_watched``:
        gloo groups are published from their recorder (else only the gloo halves of mixed
        groups, named by ``mixed``: see ``recorder_slots``)."""
        self.ledger = ledger
        self._deadlines = deadlines
        self.on_overdue = on_overdue
        self.on_notice = on_notice
        self._noticed = False
        self.readers = list(readers)
        self.tick_s = tick_s
        self.timing = timing
        self._members = members
        self._gloo_watched = gloo_watched
        self._mixed = mixed
        self._clock = clock
        self._bound: dict[tuple[Recorder, int], _Bound | None] = {}  # None: not watched
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one tick at a time (the thread's, or a caller's)

    def add(self, reader: FlightRecorderReader) -> None:
        """Watch the groups of one more recorder (any thread)."""
        with self._lock:
            if all(r.recorder is not reader.recorder for r in self.readers):
                self.readers.append(reader)

    def sample(self) -> None:
        """Read every recorder once and publish what moved; then report the operations that
        passed their deadline."""
        late: list[Overdue] = []
        notice, waiting = None, None
        with self._lock:
            for reader in self.readers:
                late += self._sample(reader)
            if self.on_notice is not None:
                posted = self.ledger.notice()
                if posted is not None and not self._noticed:
                    notice, waiting = posted, self._waiting_in()
                # a regroup clears the notice: the next one, in the next generation, is taken
                self._noticed = posted is not None
        if notice is not None and self.on_notice is not None:
            self.on_notice(notice, waiting)
        if self.on_overdue is not None:
            for op in late:
                self.on_overdue(op)

    def _waiting_in(self) -> Overdue | None:
        """The operation this rank has waited in longest, of every group watched; None when it
        waits in none."""
        now = self._clock()
        pending = [(bound.record.pending_since, recorder.value, pg_id, recorder)
                   for (recorder, pg_id), bound in self._bound.items()
                   if bound is not None and bound.record is not None and bound.record.pending]
        if not pending:
            return None
        _, _, pg_id, recorder = min(pending)
        return self._overdue(recorder, pg_id, now)

    def waiting_in(self, name: str) -> Overdue | None:
        """The operation of the group ``name`` this rank waits in, read afresh (any thread);
        None when it waits in none."""
        self.sample()
        with self._lock:
            now = self._clock()
            for (recorder, pg_id), bound in self._bound.items():
                if (bound is not None and bound.name == name and bound.record is not None
                        and bound.record.pending):
                    return self._overdue(recorder, pg_id, now)
        return None

    def describe(self, name: str) -> dict[str, object] | None:
        """This rank's progress in the asynchronous group ``name`` (``world``: the default
        group), as a peer's probe wants it (``groups.describe``); None: no such group."""
        for bound in list(self._bound.values()):
            if bound is not None and bound.name == name and bound.record is not None:
                record = bound.record
                return {"entered": record.enqueued, "done": record.completed,
                        "op": _ledger.op_name(record.kind), "world": bound.is_world,
                        "retired": None, "asynchronous": True}
        return None

    def _sample(self, reader: FlightRecorderReader) -> list[Overdue]:
        progress = reader.read()
        now = self._clock()
        per_op_s, limit_at = self._deadlines() if self._deadlines is not None else (None, None)
        late = []
        wanted: dict[int, int] = {}
        for pg_id, counts in progress.groups.items():
            key = (reader.recorder, pg_id)
            if key not in self._bound:
                if counts.enqueued < 1:
                    continue  # nothing to show yet, and no entry to learn its name from
                self._bind(reader, pg_id)
            bound = self._bound.get(key)
            if bound is None:
                continue
            record = advance(bound.record, counts,
                             self.timing and reader.recorder is Recorder.NCCL, now)
            bound.times.saw(record.completed, now)
            pending = kind_wanted(record, now)
            if pending:
                wanted[pg_id] = pending
            self._publish(bound, record)
            if not bound.overdue and overdue(record, now, per_op_s, limit_at):
                bound.overdue = True
                wanted.setdefault(pg_id, record.pending)
                late.append(pg_id)
        if wanted:
            self._learn_kinds(reader, wanted, now)
        return [self._overdue(reader.recorder, pg_id, now) for pg_id in late]

    def _overdue(self, recorder: Recorder, pg_id: int, now: float) -> Overdue:
        bound = self._bound[(recorder, pg_id)]
        assert bound is not None and bound.record is not None
        record = bound.record
        known = record.kind_of >= record.pending  # else the kind is an earlier operation's
        return Overdue(bound.name, bound.ranks, bound.is_world,
                       _ledger.op_name(record.kind if known else NONE),
                       max(record.pending, record.kind_of), now - record.pending_since, recorder)

    def _publish(self, bound: _Bound, record: Published) -> None:
        if record != bound.record:
            bound.slot.publish(record.kind, record.enqueued, record.started, record.completed,
                               record.t_enter, record.t_done, bound.on_host)
            bound.record = record

    def _learn_kinds(self, reader: FlightRecorderReader, wanted: dict[int, int],
                     now: float) -> None:
        """Learn from the recorder's entries how far each group of ``wanted`` really got
        (``with_retired``) and the kind of the operation it waits in."""
        entries = reader.entries(only_active=True)  # oldest first
        for pg_id, seq in wanted.items():
            bound = self._bound[(reader.recorder, pg_id)]
            assert bound is not None and bound.record is not None
            upto = (fr_progress.completed_in_order(entries, pg_id, bound.record.enqueued)
                    if reader.recorder is Recorder.NCCL
                    else fr_progress.completed_upto(entries, pg_id))
            record = with_retired(bound.record, upto, now)
            # the first not completed, at or past the one waited in; none: all completed
            # meanwhile, not asked again until another one is waited in
            seq, kind = next(((op.seq, op.kind) for op in entries if op.pg_id == pg_id
                              and not op.completed and op.seq >= max(seq, record.pending)),
                             (max(seq, record.pending), ""))
            self._publish(bound, replace(record, kind=_ledger.OP_CODES.get(kind, NONE),
                                         kind_of=seq, read_at=record.enqueued))
        self._keep(reader.recorder, entries, now)

    def _keep(self, recorder: Recorder, entries: list[Entry], now: float) -> None:
        """Write the recent operations ``entries`` show into the rings of the groups of
        ``recorder`` that have published (``fr_recent``); under the tick's lock."""
        offset = ledger_ring.wall_offset()
        for pg_id in {entry.pg_id for entry in entries}:
            bound = self._bound.get((recorder, pg_id))
            if bound is None or bound.record is None:
                continue
            record = bound.record
            bound.slot.keep(fr_recent.records(
                entries, pg_id, fr_recent.capacity(bound.is_world), record.completed,
                record.started, bound.times, now, offset))

    def keep_recent(self, recorder: Recorder, entries: list[Entry]) -> bool:
        """Write the recent operations ``entries`` (read from ``recorder`` by the caller: a
        full dump) into the groups' rings; any thread. Waits at most ``STOP_WAIT_S`` for a tick
        in progress; returns whether it wrote them."""
        if not self._lock.acquire(timeout=STOP_WAIT_S):
            return False
        try:
            self._keep(recorder, entries, self._clock())
            return True
        finally:
            self._lock.release()

    def _bind(self, reader: FlightRecorderReader, pg_id: int) -> None:
        name, desc = reader.group_names().get(pg_id, ("", ""))
        key = (reader.recorder, pg_id)
        on_host = reader.recorder is Recorder.CPU
        if not name:
            return  # its entries are not in the ring yet: asked again next tick
        choice = recorder_slots.slot_for(reader.recorder, name, desc,
                                         gloo_watched=self._gloo_watched,
                                         mixed=on_host and name in self._mixed())
        if choice is None:
            self._bound[key] = None
            return
        ranks = [] if choice.is_world else self._members(name)  # the world's: every rank
        if ranks is None:
            return
        # a group made anew under a gone one's name (a newer default group after
        # destroy_process_group or a regroup; a mixed default group's gloo half) takes over
        # the gone one's slot
        earlier = [other for other, bound in self._bound.items()
                   if bound is not None and bound.name == choice.name]
        gone = self._bound[earlier[0]] if earlier else None
        for other in earlier:
            self._bound[other] = None
        slot: _ledger._SlotWriter | None
        if choice.is_world:
            slot = world = self.ledger.world()
            world.reset()
        elif gone is not None:
            slot = self.ledger.reuse_group(gone.slot, choice.name, ranks)
        else:
            slot = self.ledger.add_group(choice.name, ranks)
        if slot is None:
            say_untracked(choice.name)
        self._bound[key] = None if slot is None else _Bound(slot, choice.is_world, choice.name,
                                                            tuple(ranks), on_host)

    def start(self) -> None:
        """Run :meth:`sample` every ``tick_s`` on a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="rankguard-async-groups",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.sample()
            except Exception as error:  # noqa: BLE001 (a broken read must not end the rank)
                os.write(2, f"rankguard: rank {os.environ.get('RANK', '?')}: NCCL groups are no "
                            f"longer watched: reading torch's Flight Recorder failed: "
                            f"{error!r}\n".encode())
                return

    def stop(self) -> None:
        """End the thread, then publish the groups' last counts: the ones a rank leaves with,
        which the launcher judges its departure by (``outcome.early_exit``). Waits at most
        ``STOP_WAIT_S`` for the thread, and as long again for a tick it is still in (a loaded
        machine's thread may not be scheduled in time, and the last counts must not be
        skipped for that: they were); a tick stuck longer is left, and so are the counts."""
        self._stop.set()
        if self._thread is None or self._thread is threading.current_thread():
            return
        self._thread.join(STOP_WAIT_S)
        if not self._lock.acquire(timeout=STOP_WAIT_S):
            return
        self._lock.release()  # no tick in progress: the thread ends without another
        try:
            self.sample()
            for reader in list(self.readers):  # the recent operations it leaves with
                self.keep_recent(reader.recorder, reader.entries_of(reader.dump()))
        except Exception:  # noqa: BLE001 (leaving: a broken read must not fail the exit)
            pass


_untracked_said = False


def say_untracked(name: str) -> None:
    """Say once per rank that a group has no ledger slot: its hangs go unseen."""
    global _untracked_said
    if _untracked_said:
        return
    _untracked_said = True
    rank = os.environ.get("RANK", "?")
    os.write(2, f"rankguard: rank {rank}: process group {name!r} and any created after it are "
                f"not watched: the ledger holds {_ledger.MAX_GROUPS - 1} sub-groups (destroyed "
                "ones included); a hang in them is not seen, but collective deadlines still "
                "apply\n".encode())


def torch_members(name: str) -> list[int] | None:
    """The global ranks of this process's group named ``name`` in torch.distributed's
    registry (None: no such group, or it is being destroyed)."""
    from torch.distributed import distributed_c10d as c10d

    for group, group_name in fr_progress.torch_groups().items():
        if group_name == name:
            try:
                return list(c10d.get_process_group_ranks(group))
            except (RuntimeError, ValueError):
                return None
    return None


_sampler: AsyncGroupSampler | None = None
_unavailable_said: set[Recorder] = set()


def watch(ledger: _ledger.LedgerWriter, recorder: Recorder, lag: float,
          deadlines: Deadlines | None = None,
          on_overdue: Callable[[Overdue], None] | None = None,
          on_notice: Callable[[tuple[str, int], Overdue | None], None] | None = None) -> bool:
    """Publish the groups of ``recorder`` in ``ledger`` from now on (idempotent), and report
    their operations that pass ``deadlines`` to ``on_overdue`` (see the sampler); returns
    whether they are watched. A recorder that cannot be read is said once on stderr, with how
    to turn it on, and its groups go unwatched (the job runs on)."""
    global _sampler
    try:
        reader = FlightRecorderReader(recorder)
    except FlightRecorderUnavailable as error:
        if recorder not in _unavailable_said:
            _unavailable_said.add(recorder)
            os.write(2, f"rankguard: rank {os.environ.get('RANK', '?')}: {recorder.value} "
                        f"process groups are not watched: {error}\n".encode())
        return False
    if _sampler is None:
        _sampler = AsyncGroupSampler(ledger, [reader], tick_for(lag), fr_progress.timing_on(),
                                     torch_members, deadlines=deadlines, on_overdue=on_overdue,
                                     on_notice=on_notice,
                                     gloo_watched=options.gloo_mode() == "recorder",
                                     mixed=recorder_slots.mixed_group_names)
        _sampler.start()
        atexit.register(_sampler.stop)
    else:
        _sampler.add(reader)
    return True


def sampler() -> AsyncGroupSampler | None:
    """The rank's sampler, once :func:`watch` started it."""
    return _sampler


DUMP_WAIT_S = 0.5  # torch's dump: 17 ms with 2000 entries on NCCL, 15 ms on gloo (fr_progress)
_dumped = False


def keep_torch_dump() -> str | None:
    """Write torch's Flight Recorder dump of this rank (``fr_progress.write_dump``) beside its
    stacks file (``RANKGUARD_STACKS``), once per process, where ``python -m
    torch.distributed.flight_recorder.fr_trace FOLDER`` analyses every rank's together, and
    keep the recent operations it holds in the ledger's rings (``fr_recent``); returns its path,
    or None (no group watched, no stacks folder, or it failed or took longer than
    ``DUMP_WAIT_S``: said on stderr). Called before anything aborts a communicator: an abort
    makes every pending operation read completed."""
    global _dumped
    folder = os.path.dirname(os.environ.get("RANKGUARD_STACKS", ""))
    if _dumped or _sampler is None or not folder:
        return None
    _dumped = True
    rank = int(os.environ.get("RANK", "0"))
    written: list[str] = []

    def write() -> None:
        assert _sampler is not None
        for reader in list(_sampler.readers):
            dump = reader.dump()
            _sampler.keep_recent(reader.recorder, reader.entries_of(dump))
            written.append(reader.write_dump(folder, rank, dump=dump))

    if not nccl_abort.finished_within(write, DUMP_WAIT_S, "rankguard-fr-dump") or not written:
        os.write(2, f"rankguard: rank {rank}: torch's Flight Recorder dump was not written "
                    f"within {DUMP_WAIT_S:g} s\n".encode())
        return None
    return written[-1]
