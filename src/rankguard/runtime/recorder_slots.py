"""Which ledger slot each group of torch's Flight Recorders publishes to, mixed groups included.

A group made with ``backend="cpu:gloo,cuda:nccl"`` (torchtitan's and Megatron's way of having
CPU collectives, ``all_gather_object`` and the like, beside the GPU's) has two backends under one
name: NCCL runs its CUDA tensors, gloo its CPU tensors. Each keeps its own recorder and numbers
its collectives apart, so the two halves cannot share a slot: NCCL's half takes the group's
own (the world slot for the default group), gloo's half a sub-group slot named after the group
with :data:`GLOO_HALF` appended (``world/gloo`` for the default group: verdicts name it so),
whose members are the group's. Without it a rank that never reached a CPU collective of such a
group was seen by nobody: the NCCL half had nothing pending, and rankguard does not wrap a
mixed group (a wrapper would drop the NCCL half).

The gloo recorder is otherwise read only with ``RANKGUARD_GLOO=recorder``: by default gloo
groups are wrapped, and their wrapper's slot says their progress.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ..records.ledger import GLOO_HALF
from . import fr_progress, nccl_abort
from .fr_progress import Recorder
from .state import WORLD

DEFAULT_DESC = "default_pg"  # torch's description of the default group in its recorders


@dataclass(frozen=True)
class SlotChoice:
    """Where a recorder's group publishes: the world slot, or a sub-group slot named ``name``
    (``name`` is also what probes and errors call the group)."""

    is_world: bool
    name: str


def slot_for(recorder: Recorder, name: str, desc: str, *, gloo_watched: bool,
             mixed: bool) -> SlotChoice | None:
    """The slot of the group torch names ``name`` (described ``desc``) in ``recorder``; None
    when that recorder's view of it is not published (a gloo group rankguard wraps).

    ``gloo_watched``: gloo groups are read from their recorder (``RANKGUARD_GLOO=recorder``);
    ``mixed``: the group has an NCCL backend beside its gloo one."""
    is_default = desc == DEFAULT_DESC
    if recorder is Recorder.CPU and mixed:
        return SlotChoice(False, (WORLD if is_default else name) + GLOO_HALF)
    if recorder is Recorder.CPU and not gloo_watched:
        return None
    return SlotChoice(True, WORLD) if is_default else SlotChoice(False, name)


def mixed_group_names() -> set[str]:
    """torch's names of this process's groups that have an NCCL backend and a gloo one (empty
    where torch.distributed is not imported or has no NCCL)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return set()
    import torch

    names = fr_progress.torch_groups()
    gloo = getattr(dist, "ProcessGroupGloo", None)
    found = set()
    for group, _ in nccl_abort.nccl_groups():
        try:
            cpu = group._get_backend(torch.device("cpu"))
        except RuntimeError:  # no CPU backend in this group
            continue
        if gloo is not None and isinstance(cpu, gloo) and group in names:
            found.add(str(names[group]))
    return found
