"""A node's beat, as its agent publishes it in the round's store and anyone may read it back:
the node's host and its ranks' progress (the launcher's ``node_beats`` and ``remote_progress``,
and ``rankguard status`` from another node's point of view).

A beat is ``{"seq": N, "host": H, "ranks": [ENTRY, ...]}`` (JSON), sealed with the job's secret
(``sealed``) under the key ``key(prefix, node)``; each ENTRY is one rank's progress
(:func:`beat_entry`). When some of its ranks' groups are asynchronous (NCCL: counted as torch
counts them, see ``ledger.GroupProgress``) the beat also has ``"async": [[RANK, POSITION,
STARTED], ...]``: the group at POSITION in the rank's entry (0: the world group, 1: its first
sub-group) is asynchronous, its device started up to STARTED (-1: not known). When some of its
ranks left with code 0 (their scripts ended: ``ledger.FAULT_EXITING``) it has ``"left": [[RANK,
WALL_MS], ...]``, when each left in wall-clock milliseconds: another node's ranks may have gone
on to an operation they left before (``outcome.remote_departure``). Pure functions.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from .ledger import FAULT_EXITING, OP_CODES, RankProgress

WORLD_FIELDS = 4  # rank, entered, done, kind
GROUP_FIELDS = 5  # key, members, entered, done, kind


def beat_entry(rank: int, snap: RankProgress) -> list[int]:
    """Rank ``rank``'s progress in a beat: its world group, then each sub-group. Pure."""
    world = snap.groups[0]
    entry = [rank, world.entered, world.done, OP_CODES.get(world.kind, 0)]
    for group in snap.groups[1:]:
        entry += [group.key, group.members, group.entered, group.done,
                  OP_CODES.get(group.kind, 0)]
    return entry


def beat_async(rank: int, snap: RankProgress) -> list[list[int]]:
    """Rank ``rank``'s asynchronous groups, for a beat's ``async`` list. Pure."""
    return [[rank, position, group.started] for position, group in enumerate(snap.groups)
            if group.asynchronous]


def beat_left(rank: int, snap: RankProgress, wall_offset: float) -> list[int] | None:
    """Rank ``rank``'s departure for a beat's ``left`` list, if it left with code 0 (its
    ledger's time plus ``wall_offset``, in ms). Pure."""
    if snap.fault != FAULT_EXITING or snap.exit_code != 0:
        return None
    return [rank, round((snap.t_fault + wall_offset) * 1000)]


class Decoded(NamedTuple):
    """A beat's progress: each rank's entry (:func:`decode_ranks`), its asynchronous groups
    (:func:`decode_async`) and the ranks that left with code 0 (rank -> wall-clock seconds)."""

    ranks: list[list[int]]
    asynchronous: dict[tuple[int, int], int]
    left: dict[int, float]


def decode(value: bytes) -> Decoded:
    """A beat's progress, parsed once; what is not ours is left out (see :func:`decode_ranks`
    and :func:`decode_async`). Pure."""
    try:
        beat = json.loads(value)
    except ValueError:
        return Decoded([], {}, {})
    if not isinstance(beat, dict):
        return Decoded([], {}, {})
    return Decoded(_ranks(beat.get("ranks")), _async(beat.get("async", [])),
                   _left(beat.get("left", [])))


def decode_async(value: bytes) -> dict[tuple[int, int], int]:
    """A beat's asynchronous groups: (rank, position) -> started (see the module doc); what is
    not ours is left out. Pure."""
    return decode(value).asynchronous


def decode_ranks(value: bytes) -> list[list[int]]:
    """Each rank's entry in a beat (:func:`beat_entry`); an entry (or a beat) that is not one of
    ours is left out. The world group's fields are checked here; a sub-group's where it is used
    (:meth:`RemoteProgress.snapshots` leaves out one whose fields are not all whole numbers).
    Pure."""
    return decode(value).ranks


def _async(found: object) -> dict[tuple[int, int], int]:
    if not isinstance(found, list):
        return {}
    return {(item[0], item[1]): item[2] for item in found
            if type(item) is list and len(item) == 3 and all(type(x) is int for x in item)}


def _left(found: object) -> dict[int, float]:
    if not isinstance(found, list):
        return {}
    return {item[0]: item[1] / 1000 for item in found
            if type(item) is list and len(item) == 2 and all(type(x) is int for x in item)}


def _ranks(entries: object) -> list[list[int]]:
    if not isinstance(entries, list):
        return []
    return [entry for entry in entries
            if (type(entry) is list and len(entry) >= WORLD_FIELDS
                and (len(entry) - WORLD_FIELDS) % GROUP_FIELDS == 0
                and type(entry[0]) is int and type(entry[1]) is int and type(entry[2]) is int
                and type(entry[3]) is int)]


def encode(sequence: int, host: str, progress: list[list[int]],
           asynchronous: list[list[int]] | None = None,
           left: list[list[int]] | None = None) -> str:
    """A beat: its sequence number (it changes every beat), the node's host and its ranks'
    progress (``[rank, entered, done, kind]`` in the world group, each), their asynchronous
    groups (:func:`beat_async`) and their departures (:func:`beat_left`), if any."""
    beat: dict[str, object] = {"seq": sequence, "host": host, "ranks": progress}
    if asynchronous:
        beat["async"] = asynchronous
    if left:
        beat["left"] = left
    return json.dumps(beat, separators=(",", ":"))


def host_of(value: bytes) -> str:
    try:
        return str(json.loads(value).get("host", ""))[:100]
    except (ValueError, AttributeError):
        return ""


def key(prefix: str, node: int) -> str:
    """Where node ``node``'s beat is, under the round's agents' prefix."""
    return f"{prefix}beat{node}"
