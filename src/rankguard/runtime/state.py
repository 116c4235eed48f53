"""What the rank runtime knows, in one object, and its record of each process group.

A rank process has exactly one :class:`RankState`, made when this module is imported and never
replaced; every part of the runtime reaches it through :func:`current`. The bootstrap and
``rankguard.init()`` fill it in; the instrumented groups, bounded works, regroup, shutdown and
the SIGTERM teardown read it.

Per-group information lives in a :class:`GroupRecord`, kept in the state's
:class:`GroupRegistry` and looked up by the torch group object. Nothing is stored on torch's
objects. The registry holds the groups weakly: a group that torch destroys and nobody holds
drops out. A record outlives :meth:`GroupRegistry.discard_all` (regroup, an aborted shutdown):
a stale reference to an old group still finds its record, which says the group was retired.

This module is the bottom of the runtime: it imports nothing of it but ``completions`` (and,
for the types of its fields only, ``probe`` and ``shutdown_report``, which import nothing of the
runtime).
"""

from __future__ import annotations

import collections
import threading
import weakref
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from ..records import ledger as _ledger
from ..errors import CollectiveError
from .completions import CompletionTracker

if TYPE_CHECKING:  # the types of fields; importing torch here would import it in every rank
    from torch.distributed import ProcessGroupGloo, Store

    from ..inject.perform import Injector
    from .probe import Asker, Responder
    from .shutdown_report import ShutdownReport

WORLD = "world"  # the name of the default group in messages, probes and notices


@dataclass(eq=False)
class GroupRecord:
    """What rankguard knows of one instrumented process group of this rank.

    Attributes:
        name: ``"world"`` for the default group, else torch's group name.
        ranks: the global ranks of its members, in group-rank order.
        rank: this rank's global rank.
        is_world: whether it is the default group.
        slot: its slot in the progress ledger, or None without a ledger.
        backend: the gloo backend doing its work.
        retired: why it was retired, or None while it is usable.
        notice: the peer's report that made it retire, when that is how this rank learnt of it
            (then a waiting collective raises ``PeerFailed`` rather than ``GroupRetired``).
        discarded: no longer one of this rank's current groups (its name may be reused).
    """

    name: str
    ranks: list[int]
    rank: int
    is_world: bool
    slot: _ledger._SlotWriter | None = None
    backend: ProcessGroupGloo | None = None
    retired: str | None = None
    notice: dict[str, Any] | None = None
    discarded: bool = False

    @property
    def peers(self) -> list[int]:
        """The members other than this rank."""
        return [r for r in self.ranks if r != self.rank]


class GroupRegistry:
    """The records of this rank's instrumented groups, looked up by the group object.

    Keyed by ``id(group)`` with a weak reference that removes the entry when the group dies
    (before its id can be reused): a lookup is one dict access on the hot path of every
    collective.
    """

    def __init__(self) -> None:
        self._records: dict[int, GroupRecord] = {}
        self._refs: dict[int, weakref.ref[object]] = {}
        # ``of`` without its frame, for the hot path: the record for ``id(group)``, or None
        self.of_id = self._records.get
        self.lock = threading.Lock()  # held while a record's retirement changes

    def add(self, group: object, record: GroupRecord) -> None:
        """Keep ``record`` for ``group`` (weakly: it goes when the group does)."""
        key = id(group)

        def forget(_: object, key: int = key) -> None:
            self._records.pop(key, None)
            self._refs.pop(key, None)

        with self.lock:
            self._refs[key] = weakref.ref(group, forget)
            self._records[key] = record

    def of(self, group: object) -> GroupRecord | None:
        """The record of ``group``, or None for a group rankguard does not instrument."""
        return self._records.get(id(group))

    def live(self) -> list[GroupRecord]:
        """The records of this rank's current groups, newest first."""
        with self.lock:
            records = list(self._records.values())  # a copy: a group's death may pop one
        return [record for record in reversed(records) if not record.discarded]

    def by_name(self, name: str) -> GroupRecord | None:
        """The current group called ``name`` (the newest, if names repeat), or None."""
        return next((record for record in self.live() if record.name == name), None)

    def world(self) -> GroupRecord | None:
        """The current default group's record, or None."""
        return next((record for record in self.live() if record.is_world), None)

    def discard_all(self) -> None:
        """None of the current groups is this rank's any more (their records stay, for stale
        references to them)."""
        with self.lock:
            for record in list(self._records.values()):
                record.discarded = True


class HandedOut(Protocol):
    """A work whose future went to C++ code (DDP's reducer): ``runtime.bounded``'s."""

    def explain_if_failed(self) -> CollectiveError | None:
        """The rankguard error of its operation if that failed, else None."""

    def release_if_retired(self) -> None:
        """Fail the future C++ waits on if the group retired meanwhile."""


@dataclass(eq=False)
class RankState:
    """The runtime state of this rank process.

    Attributes:
        ledger: the progress ledger this rank writes, or None.
        injector: the injected faults of this rank (``inject.perform.Injector``), or None.
        namespace: the store prefix of this attempt, under the launcher.
        launcher_store: ``(MASTER_ADDR, MASTER_PORT)`` as the launcher gave them.
        bounded: every operation returns a bounded work (see ``runtime.bounded``).
        generation: of the default group (see ``runtime.generations``).
        pg_timeout: the timeout the default group was created with.
        asker, responder: the probe's (``runtime.probe``), kept across generations.
        lineage_root: the store of generation 0, under which every later one lives.
        lineage_client: regroup's own connection to it, made once (see ``probe.Responder``).
        probe_store: the store generation 0's probes live in, for a replacement (whose own
            first group belongs to a later generation); None: its first group's.
        completions: marks completed operations in the ledger.
        groups: the records of this rank's instrumented groups.
        handed_out: works whose future went to C++ (DDP): a failed one explains a
            RuntimeError raised by ``backward()``.
        last_failure: the last collective error this rank raised in this generation.
        aborted: the ``ShutdownReport`` of the ``shutdown()`` that aborted this rank's groups;
            a later call, with no group created since, returns it again (not "clean").
        record_only: every operation so far needs nothing but its record in the ledger (not
            bounded, no injected fault, no deadline ever set): the instrumented group takes its
            shortest path. Once False, it stays False.
        awaiting_state: a replacement that joined its generation and has not yet received the
            state from a peer (``peer_state.share``): the survivors wait for it in that
            exchange, so a process group it makes now would wait for peers that never come.
        usage_exit: why the process is about to end on a mistake of the user's that every
            attempt would make again (the pytest plugin's ranks that collected different
            tests): its non-zero exit is recorded as a usage error, not restarted.
        left_out: why this rank has no place in the generation its peers formed last
            (``regroup()`` left it out): a ``shutdown()`` has nobody to meet. None once a
            default group is created again.
        unconnected: ``(backend, rank, size)`` of the generation whose connect failed (a
            member died after it joined), which left this rank without a default group: the
            next ``regroup()`` forms the one after it from these. None once a group connects.
    """

    ledger: _ledger.LedgerWriter | None = None
    injector: Injector | None = None
    namespace: str | None = None
    launcher_store: tuple[str, str] | None = None
    bounded: bool = False
    generation: int = 0
    pg_timeout: timedelta | None = None
    asker: Asker | None = None
    responder: Responder | None = None
    lineage_root: Store | None = None
    lineage_client: Store | None = None
    probe_store: Store | None = None
    completions: CompletionTracker = field(default_factory=CompletionTracker)
    groups: GroupRegistry = field(default_factory=GroupRegistry)
    handed_out: collections.deque[HandedOut] = field(
        default_factory=lambda: collections.deque(maxlen=256))
    last_failure: CollectiveError | None = None
    aborted: ShutdownReport | None = None
    world_formations: int = 0  # default groups formed in the launcher's store
    record_only: bool = True
    awaiting_state: bool = False
    usage_exit: str | None = None
    left_out: str | None = None
    unconnected: tuple[str, int, int] | None = None

    def enable_bounded(self) -> None:
        """Every operation from now on returns a bounded work; the supervisor may send
        notices."""
        self.bounded = True
        self.record_only = False
        if self.ledger is not None:
            self.ledger.set_flag(_ledger.FLAG_BOUNDED)


_state = RankState()


def current() -> RankState:
    """This process's runtime state (one per process, for its whole life)."""
    return _state
