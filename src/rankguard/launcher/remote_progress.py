"""The other nodes' ranks as this node's hang rules see them, from the progress in their beats.

Each node's beat carries its ranks' progress (``beats.beat_entry``): per rank, the world group's
``entered, done, kind``, then one ``key, members, entered, done, kind`` per sub-group in its
ledger (``members``: the bit mask of the ledger, ranks below 64), and which of those groups are
asynchronous (NCCL) with the last operation their device started. :class:`RemoteProgress` turns
the beats heard into the ledger records the hang rules judge (``monitor.HangRules``), so that a
verdict compares every rank of the job, not only this node's, in every group: the node that
holds a rank which never reached a collective names it even when every rank waiting for it is
on another node.

A remote rank's times are this node's: when an exchange first saw its current progress (at
most one beat period and one exchange late). Its process cannot be sampled from here, so
the rules see it as busy (``HangMonitor.check``'s default for remote ranks: never blamed as
frozen by a node that cannot see it); its own node judges it.
"""

from __future__ import annotations

from typing import Mapping

from ..records.beats import GROUP_FIELDS, WORLD_FIELDS, decode
from ..records.ledger import FAULT_NONE, GroupProgress, RankProgress, group_key, op_name
from ..records.ledger_ring import wall_offset

_WORLD_KEY = group_key("world")
# The world group's first entry is init_process_group. A remote rank waiting in it is not shown
# as waiting: nodes start their ranks at different times (one from warm spares, another cold,
# importing torch), so ranks of one node may wait there for another node's longer than a hang
# timeout while nothing is wrong; a node whose agent is alive is starting them. A rank that
# never gets there is still judged by its own node, beside its own ranks.
_INIT_ENTRY = 1


class RemoteProgress:
    """The other nodes' ranks, as ledger records on this node's clock (see the module doc).

    A rank's world group is dated by itself; its sub-groups together, by when their fields were
    first seen as they are (a rank blocked in a collective changes none of them): cheaper at
    10,000 ranks, and never earlier than each group's own date, so never a verdict sooner."""

    def __init__(self, world_size: int, local: set[int]) -> None:
        self._world = world_size
        self._local = local
        self._parsed: dict[int, bytes] = {}  # node -> the beat last decoded
        # rank -> its world group: (entered, done, kind code, since: when first seen as it is)
        self._ranks: dict[int, tuple[int, int, int, float]] = {}
        # rank -> its sub-groups' fields, since when they are as they are, whether one waits
        self._subs: dict[int, tuple[list[int], float, bool]] = {}
        # (rank, position of the group in its entry) -> started, for its asynchronous groups
        self._async: dict[tuple[int, int], int] = {}
        self._snaps: dict[int, RankProgress] = {}  # made again only for ranks that changed
        self._stale: set[int] = set()  # ranks whose record must be made again
        self._members = (1 << world_size) - 1 if world_size <= 64 else 0
        self._left: dict[int, float] = {}  # rank -> when it left with code 0 (wall clock)
        self._node_of: dict[int, int] = {}  # rank -> the node whose beat carries it

    def update(self, beats: Mapping[int, tuple[bytes, float]]) -> None:
        """Take in the beats heard (node -> its value and when an exchange first saw it);
        only the ones that changed since the last update are decoded."""
        ranks, stale, local, world = self._ranks, self._stale, self._local, self._world
        for node, (value, seen) in beats.items():
            if self._parsed.get(node) == value:
                continue
            self._parsed[node] = value
            decoded = decode(value)
            for (rank, position), started in decoded.asynchronous.items():
                if rank not in local and 0 <= rank < world and \
                        self._async.get((rank, position)) != started:
                    self._async[(rank, position)] = started
                    stale.add(rank)
            for rank, wall in decoded.left.items():
                if rank not in local and 0 <= rank < world:
                    self._left[rank] = wall
            for entry in decoded.ranks:
                rank, entered, done = entry[0], entry[1], entry[2]
                if rank in local or not 0 <= rank < world:
                    continue
                self._node_of[rank] = node
                known = ranks.get(rank)
                if known is None or known[0] != entered or known[1] != done:
                    ranks[rank] = (entered, done, entry[3], seen)
                    stale.add(rank)
                if len(entry) > WORLD_FIELDS:
                    self._take_subs(rank, entry[WORLD_FIELDS:], seen)

    def _take_subs(self, rank: int, fields: list[int], seen: float) -> None:
        was = self._subs.get(rank)
        if was is not None and was[0] == fields:
            return
        try:
            waiting = any(entered > done for entered, done in
                          zip(fields[2::GROUP_FIELDS], fields[3::GROUP_FIELDS]))
        except TypeError:  # not numbers: not ours
            return
        self._subs[rank] = (fields, seen, waiting)
        self._stale.add(rank)

    def snapshots(self, cutoff: float, local_waiting: bool) -> dict[int, RankProgress]:
        """Every remote rank heard of, as a ledger with its groups (the caller must not change
        the mapping), when the hang rules may find something: a rank of this node has waited
        long (``local_waiting``), or a remote rank waits since before ``cutoff``. Else nothing:
        a job of 10,000 ranks would cost tens of milliseconds of records per tick for rules
        that find no waiter."""
        if not local_waiting and not self._waits_since(cutoff):
            return {}
        for rank in self._stale:
            self._snaps[rank] = self._snapshot(rank)
        self._stale.clear()
        return self._snaps

    def departures(self) -> dict[int, tuple[RankProgress, float]]:
        """The remote ranks that left with code 0: each one's progress as it left and when
        (this machine's monotonic clock, through the wall clock the nodes share)."""
        offset = wall_offset()
        return {rank: (self._snapshot(rank), wall - offset) for rank, wall in self._left.items()
                if rank in self._ranks}

    def node_of(self, rank: int) -> int | None:
        """The node whose beats carry ``rank`` (None: not heard of, or this node's)."""
        return self._node_of.get(rank)

    def _waits_since(self, cutoff: float) -> bool:
        """Whether a remote rank waits in a group since before ``cutoff``."""
        return (any(entered > done and since <= cutoff
                    for entered, done, _, since in self._ranks.values())
                or any(waiting and since <= cutoff for _, since, waiting in self._subs.values()))

    def _snapshot(self, rank: int) -> RankProgress:
        entered, done, kind, since = self._ranks.get(rank, (0, 0, 0, 0.0))
        world_async = (rank, 0) in self._async
        if entered <= _INIT_ENTRY and not world_async:
            done = entered  # see _INIT_ENTRY (an asynchronous group counts no init entry)
        groups = [GroupProgress(_WORLD_KEY, self._members, True, self._world, entered, done,
                                op_name(kind), since, since, self._async.get((rank, 0), -1),
                                world_async)]
        fields, since, _ = self._subs.get(rank, ([], 0.0, False))
        for position, at in enumerate(range(0, len(fields), GROUP_FIELDS), 1):
            key, members, entered, done, kind = group = fields[at:at + GROUP_FIELDS]
            if all(type(field) is int for field in group):
                started = self._async.get((rank, position))
                groups.append(GroupProgress(key, members, False, bin(members).count("1"),
                                            entered, done, op_name(kind), since, since,
                                            -1 if started is None else started,
                                            started is not None))
        return RankProgress(0, 0, FAULT_NONE, False, 0.0, 0.0, tuple(groups))
