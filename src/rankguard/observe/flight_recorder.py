"""A run's recent operations as PyTorch Flight Recorder dumps, for torch's own trace analyser
(``python -m torch.distributed.flight_recorder.fr_trace DIR``).

One pickle per rank, ``rank_R`` (the analyser's default prefix), in the dump format of torch's
Flight Recorder version ``VERSION`` (the one torch 2.13 writes). The mapping from the ledger's
ring (``recent_file``):

- every operation the ring kept becomes an entry: ``record_id`` its place in the rank's order,
  ``process_group`` (the group's key, ``default_pg`` for the world, else ``ranks 0,2``),
  ``collective_seq_id`` its number in its group as rankguard shows it (``all_reduce #57``: 57),
  ``profiling_name`` its library and torch's name for it: ``nccl:`` and NCCL's names for an
  asynchronous group's operation (also gloo's under ``RANKGUARD_GLOO=recorder``), else
  ``gloo:``. torch's analyser before 2.13 takes only ``nccl:`` and ``xccl:`` names, and a
  barrier only as NCCL's ``all_reduce_barrier`` (2.11: "name formatting error? gloo"), so NCCL
  groups' dumps are read by torch 2.11's analyser too; ``time_created_ns`` and
  ``time_discovered_started_ns`` when the rank entered it, ``time_discovered_completed_ns`` when
  it was seen completed (rankguard learns it the way the Flight Recorder's watchdog does: when it
  next looks, not at the instant), ``state`` ``completed`` or ``started``;
- a rank records its completions late (``runtime/completions``: up to ``REAP_AT - 1``
  operations, or a sweep, behind), so a rank that was killed shows its last few operations
  started although it went past them. ``with_proven_completions`` reads them from the rank's
  group: a collective that every member must take part in before any member completes it
  (``SYMMETRIC``) is completed on a rank once another member saw it completed and went on to a
  later operation of the group (an error ends a member's use of the group, so a failed one is
  not taken for done);
- ``pg_config`` lists each group with its ranks.

What differs: the ledger does not keep tensor sizes or dtypes (the sizes written are ones the
analyser's checks accept, ``_sizes``; the dtypes are empty: a size or dtype mismatch between
ranks is not found this way), nor Python frames; point-to-point operations
(send, recv: the ring does not keep the peer) and rankguard's own ``init_process_group`` and
shutdown entries are left out; ``timeout_ms`` is 0 (the launcher's ``--hang-timeout`` bounds the
wait, not a per-operation timeout).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from typing import Any, Mapping

from ..records import private_files, recent_file
from ..errors import UsageError
from . import files

VERSION = "2.10"
PREFIX = "rank_"
# rankguard's operation -> the name torch's analyser knows (its COLLECTIVES)
TORCH_NAMES = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_gather": "all_gather", "all_gather_coalesced": "all_gather",
    "all_gather_into_tensor": "_all_gather_base", "broadcast": "broadcast",
    "barrier": "barrier", "shutdown": None, "reduce": "reduce", "gather": "gather",
    "scatter": "scatter", "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "_reduce_scatter_base", "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all_single",
}
# where ProcessGroupNCCL names an operation otherwise in its Flight Recorder (and torch 2.11's
# analyser knows only that name)
NCCL_NAMES = {"barrier": "all_reduce_barrier", "all_to_all_single": "all_to_all"}

# torch's names of the collectives that no member completes before every member took part
SYMMETRIC = frozenset({"all_reduce", "all_gather", "_all_gather_base", "barrier", "reduce_scatter",
                       "_reduce_scatter_base", "all_to_all", "all_to_all_single"})


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1e9)


def _group(op: recent_file.Op, world_size: int) -> tuple[str, str, list[int]]:
    """(name, desc, ranks) of the group of ``op``, the same on every rank."""
    if op.world:
        return "world", "default_pg", list(range(world_size))
    return op.group, op.group_label, list(op.members)


def _sizes(name: str, group_size: int) -> dict[str, list[list[int]]]:
    """Sizes the analyser's checks accept, the ledger keeping none: an all_gather's output is
    the group's size times its input, a reduce_scatter's input the group's size times its
    output, anything else one element in and out (the same on every rank)."""
    if name in ("all_gather", "_all_gather_base"):
        return {"input_sizes": [[]], "output_sizes": [[group_size]]}
    if name in ("reduce_scatter", "_reduce_scatter_base"):
        return {"input_sizes": [[group_size]], "output_sizes": [[]]}
    return {"input_sizes": [[]], "output_sizes": [[]]}


def with_proven_completions(recent: Mapping[int, recent_file.RankRecent]
                            ) -> dict[int, recent_file.RankRecent]:
    """Every rank's operations with the completions its group proves and its ledger had not
    recorded yet (see the module doc): a ``SYMMETRIC`` collective not seen completed on a rank is
    completed there when another member of its group saw it completed and entered a later
    operation of that group; seen completed when the first such member saw it, or when the rank
    entered it if that is later. Nothing else changes."""
    proofs: dict[tuple[str, int], dict[int, float]] = {}  # (group, seq) -> rank -> seen done
    for rank, kept in recent.items():
        last = {op.group: op.seq for op in kept.ops}
        for op in kept.ops:
            if op.t_done is not None and op.seq < last[op.group]:
                proofs.setdefault((op.group, op.seq), {})[rank] = op.t_done
    proven = {}
    for rank, kept in recent.items():
        ops = []
        for op in kept.ops:
            others = [t for member, t in proofs.get((op.group, op.seq), {}).items()
                      if member != rank]
            if op.t_done is None and others and TORCH_NAMES.get(op.op) in SYMMETRIC:
                op = dataclasses.replace(op, t_done=max(op.t_enter, min(others)))
            ops.append(op)
        proven[rank] = dataclasses.replace(kept, ops=tuple(ops))
    return proven


def dump(recent: recent_file.RankRecent, world_size: int) -> dict[str, Any]:
    """One rank's Flight Recorder dump (a dict, as the analyser unpickles it)."""
    entries = []
    pg_config: dict[str, dict[str, str]] = {}
    for op in recent.ops:
        name = TORCH_NAMES.get(op.op)
        if name is None:
            continue
        pg_name, desc, ranks = _group(op, world_size)
        pg_config.setdefault(pg_name, {"name": pg_name, "desc": desc, "ranks": str(ranks)})
        done = op.t_done is not None
        library, name = ("nccl", NCCL_NAMES.get(name, name)) if op.asynchronous else \
            ("gloo", name)
        entries.append({
            "record_id": op.number - 1, "pg_id": len(pg_config) - 1,
            "process_group": (pg_name, desc), "collective_seq_id": op.seq, "p2p_seq_id": 0,
            "op_id": op.seq, "profiling_name": f"{library}:{name}",
            "time_created_ns": _ns(op.t_enter), "time_discovered_started_ns": _ns(op.t_enter),
            "time_discovered_completed_ns": _ns(op.t_done),
            "duration_ms": (op.t_done - op.t_enter) * 1e3 if op.t_done is not None else None,
            **_sizes(name, len(ranks)), "input_dtypes": [], "output_dtypes": [],
            "state": "completed" if done else "started", "retired": done, "timeout_ms": 0,
            "is_p2p": False, "frames": []})
    return {"version": VERSION, "entries": entries, "pg_config": pg_config,
            "pg_status": {}, "rank": recent.rank}


def write(base: str, parts: tuple[str, ...], recent: Mapping[int, recent_file.RankRecent],
          world_size: int) -> list[str]:
    """Write ``rank_R`` for every rank of ``recent`` into folder ``base/parts...``; returns the
    files. The folders of ``parts`` are made (0700) if missing; each of them, and ``base`` when
    ``parts`` is empty, must be the user's own, that only they can write, and not a symlink
    (``private_files.make_private``): the dumps never land where another user chose.

    Raises:
        UsageError: a folder breaks that rule or cannot be made, or a file cannot be written.
    """
    folder = os.path.join(base, *parts)
    fd = private_files.make_private(base, parts, "-o", "give another folder")
    written = []
    try:
        for rank, kept in sorted(with_proven_completions(recent).items()):
            path = os.path.join(folder, f"{PREFIX}{rank}")
            files.write_new(path, "-o", pickle.dumps(dump(kept, world_size)), fd)
            written.append(path)
    finally:
        os.close(fd)
    return written
