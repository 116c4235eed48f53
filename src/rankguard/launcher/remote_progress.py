"""The other nodes' ranks as this node's hang rules see them, from the progress in their beats.

Each node's beat carries its ranks' progress in the world group (``[rank, entered, done,
kind]``, see ``node_beats``). :class:`RemoteProgress` turns the beats heard into the ledger
records the hang rules judge (``monitor.HangRules``), so that a verdict compares every rank of
the job, not only this node's: the node that holds a rank which never reached a collective names
it even when every rank waiting for it is on another node.

A remote rank's times are this node's: when an exchange first saw its current progress (at most
one beat period and one exchange late). Its process cannot be sampled from here, so the rules
see it as busy (``HangMonitor.check``'s default for remote ranks: never blamed as frozen by a
node that cannot see it); its own node judges it.
"""

from __future__ import annotations

import json
from typing import Mapping

from ..ledger import FAULT_NONE, GroupProgress, RankProgress, group_key, op_name

_WORLD_KEY = group_key("world")
# The world group's first entry is init_process_group. A remote rank waiting in it is not shown
# as waiting: nodes start their ranks at different times (one from warm spares, another cold,
# importing torch), so ranks of one node may wait there for another node's longer than a hang
# timeout while nothing is wrong; a node whose agent is alive is starting them. A rank that
# never gets there is still judged by its own node, beside its own ranks.
_INIT_ENTRY = 1


def decode_ranks(value: bytes) -> list[tuple[int, int, int, int]]:
    """``(rank, entered, done, kind code)`` of each rank in a beat; an entry (or a beat) that
    is not one of ours is left out. Pure."""
    try:
        entries = json.loads(value)["ranks"]
    except (ValueError, KeyError, TypeError):
        return []
    if not isinstance(entries, list):
        return []
    found = []
    for entry in entries:
        if type(entry) is list and len(entry) == 4 and all(type(f) is int for f in entry):
            found.append(tuple(entry))
    return found


class RemoteProgress:
    """The other nodes' ranks, as ledger records on this node's clock (see the module doc)."""

    def __init__(self, world_size: int, local: set[int]) -> None:
        self._world = world_size
        self._local = local
        self._parsed: dict[int, bytes] = {}  # node -> the beat last decoded
        # rank -> (entered, done, kind code, since: when its progress was first seen as it is)
        self._ranks: dict[int, tuple[int, int, int, float]] = {}
        self._snaps: dict[int, RankProgress] = {}  # made again only for ranks that changed
        self._stale: set[int] = set()  # ranks whose record must be made again
        self._members = (1 << world_size) - 1 if world_size <= 64 else 0

    def update(self, beats: Mapping[int, tuple[bytes, float]]) -> None:
        """Take in the beats heard (node -> its value and when an exchange first saw it);
        only the ones that changed since the last update are decoded."""
        for node, (value, seen) in beats.items():
            if self._parsed.get(node) == value:
                continue
            self._parsed[node] = value
            ranks, local, world = self._ranks, self._local, self._world
            for rank, entered, done, kind in decode_ranks(value):
                if rank in local or not 0 <= rank < world:
                    continue
                known = ranks.get(rank)
                if known is None or known[0] != entered or known[1] != done:
                    ranks[rank] = (entered, done, kind, seen)
                    self._stale.add(rank)

    def snapshots(self, cutoff: float, local_waiting: bool) -> dict[int, RankProgress]:
        """Every remote rank heard of, as a ledger with its world group only (the caller must
        not change the mapping), when the hang rules may find something: a rank of this node
        has waited long (``local_waiting``), or a remote rank waits since before ``cutoff``.
        Else nothing: a job of 10,000 ranks would cost tens of milliseconds of records per
        tick for rules that find no waiter."""
        if not local_waiting and not any(entered > done and since <= cutoff
                                         for entered, done, _, since in self._ranks.values()):
            return {}
        for rank in self._stale:
            self._snaps[rank] = self._snapshot(*self._ranks[rank])
        self._stale.clear()
        return self._snaps

    def _snapshot(self, entered: int, done: int, kind: int, since: float) -> RankProgress:
        if entered <= _INIT_ENTRY:
            done = entered  # see _INIT_ENTRY
        world = GroupProgress(_WORLD_KEY, self._members, True, self._world, entered, done,
                              op_name(kind), since, since)
        return RankProgress(0, 0, FAULT_NONE, False, 0.0, 0.0, (world,))