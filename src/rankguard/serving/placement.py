"""Where a pool's replicas run: each replica slot's device per rank, and the backend.

A pool keeps ``replicas + spares`` replicas; each holds a **slot** (0 to ``replicas + spares -
1``) for as long as it lives, and a replacement takes a free one (:func:`free_slot`), so that
the devices a slot was given are never used by two replicas of the pool at once (unless the
user shared them on purpose). What a slot's ranks use is decided once, from the pool's options,
by :func:`place`: on the CPU over gloo (no device option, the default), or each rank on one
CUDA device over NCCL:

- ``devices=[0, 1]``: rank r of every replica uses device ``devices[r]`` (the replicas share
  those devices: the user asked for it);
- ``devices=[[0, 1], [2, 3]]``: one list per slot, spares included;
- ``gpus_per_replica=N``: each slot gets N devices of its own, in order (slot s: devices
  ``s*N`` to ``s*N+N-1``), its ranks spread over them in contiguous blocks; more devices than
  visible is refused (sharing is asked for with ``devices=``).

Several ranks of one replica may share a device: NCCL refuses that ("Duplicate GPU detected")
unless each of them says it is a host of its own, which :meth:`ReplicaPlacement.rank_env` does
with ``NCCL_HOSTID``. A rank learns its device from its environment (:data:`DEVICE_ENV`), read
by :func:`device`.

Everything here is pure except :func:`device`, which reads this rank's environment: the count of
visible CUDA devices is an argument, so that the leader imports torch only when devices were
asked for.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import UsageError, shown
from ..inputs.options import whole_number

DEVICE_ENV = "RANKGUARD_DEVICE"  # a rank's device: "cuda:N" or "cpu"
BACKEND_ENV = "RANKGUARD_BACKEND"  # its replica's process group backend: "nccl" or "gloo"
HOSTID_ENV = "NCCL_HOSTID"
CPU = "cpu"


class Backend(enum.StrEnum):
    """The backend of a replica's process group."""

    GLOO = "gloo"  # on the CPU
    NCCL = "nccl"  # on CUDA devices


class Names(NamedTuple):
    """How the caller calls the two options, and spells a device option's value (in errors)."""

    devices: str
    gpus_per_replica: str
    one_list: str = "[0, 1]"  # one device index per rank, every replica
    per_replica: str = "[[0, 1], [2, 3]]"  # one such list per replica, spares included


POOL_NAMES = Names("Pool(devices)", "Pool(gpus_per_replica)")
CLI_NAMES = Names("--devices", "--gpus-per-replica", "0,1", "0,1/2,3")


@dataclass(frozen=True)
class ReplicaPlacement:
    """Where one replica slot's ranks run.

    Attributes:
        world_size: its ranks.
        cuda: the CUDA device index of each rank; None: every rank on the CPU.
    """

    world_size: int
    cuda: tuple[int, ...] | None = None

    @property
    def backend(self) -> Backend:
        return Backend.GLOO if self.cuda is None else Backend.NCCL

    @property
    def devices(self) -> tuple[str, ...]:
        """Each rank's device as torch writes it: ``cuda:1``, ``cpu``."""
        if self.cuda is None:
            return (CPU,) * self.world_size
        return tuple(f"cuda:{index}" for index in self.cuda)

    @property
    def shares_a_device(self) -> bool:
        """Two ranks of the replica use one CUDA device."""
        return self.cuda is not None and len(set(self.cuda)) < len(self.cuda)

    def rank_env(self, rank: int) -> dict[str, str]:
        """The environment that tells rank ``rank`` where it runs (read by the worker and by
        :func:`device`)."""
        env = {DEVICE_ENV: self.devices[rank], BACKEND_ENV: str(self.backend)}
        if self.shares_a_device:
            # NCCL takes two ranks on one device for a duplicate ("Duplicate GPU detected")
            # unless each is a host of its own: its socket transport then connects them.
            # Only then: distinct host ids would also turn off NVLink and shared memory
            # between ranks on different devices.
            env[HOSTID_ENV] = f"host{rank}"
        return env


def place(devices: Any, gpus_per_replica: Any, world_size: int, replicas: int, spares: int,
          visible: int | None, names: Names = POOL_NAMES) -> tuple[ReplicaPlacement, ...]:
    """Each of the ``replicas + spares`` slots' placement (see the module docstring).

    Args:
        devices: None, a list of CUDA device indexes (one per rank, every replica), or a list
            of such lists (one per slot, spares included).
        gpus_per_replica: None, or how many devices of its own each slot gets.
        world_size, replicas, spares: the pool's (already checked).
        visible: how many CUDA devices this process sees (``torch.cuda.device_count()``);
            only read when a device option is given.
        names: how the caller calls the two options.

    Raises:
        UsageError: both options given; a value of the wrong type, length or range; more
            devices asked for than visible. It names the option and the fix.
    """
    slots = replicas + spares
    if devices is None and gpus_per_replica is None:
        return (ReplicaPlacement(world_size),) * slots
    if devices is not None and gpus_per_replica is not None:
        raise UsageError(f"{names.devices} and {names.gpus_per_replica}", "both were given",
                         "give the devices of each rank, or how many each replica gets, "
                         "not both")
    count = visible or 0
    if devices is not None:
        return tuple(ReplicaPlacement(world_size, cuda) for cuda in
                     _explicit(devices, world_size, replicas, spares, count, names))
    per = _whole(names.gpus_per_replica, gpus_per_replica)
    if per > world_size:
        raise UsageError(names.gpus_per_replica, f"{per} devices for {world_size} rank(s) per "
                         "replica: a device would have no rank", f"give at most {world_size}")
    if per * slots > count:
        raise UsageError(names.gpus_per_replica, f"{per} per replica x {slots} replicas "
                         f"({replicas} serving and {spares} spare(s)) is {per * slots} CUDA "
                         f"devices, and {_visible(count)}",
                         "give fewer spares or replicas, or share devices on purpose with "
                         f"{names.devices}")
    return tuple(ReplicaPlacement(world_size, tuple(slot * per + rank * per // world_size
                                                    for rank in range(world_size)))
                 for slot in range(slots))


def _explicit(devices: Any, world_size: int, replicas: int, spares: int, visible: int,
              names: Names) -> list[tuple[int, ...]]:
    """``Pool(devices=)`` as one tuple of device indexes per slot: its shape is checked whole
    (types, lengths, indexes) before any index is compared with the visible devices, so that a
    malformed value is never taken for a missing GPU."""
    what = names.devices
    hint = (f"give one CUDA device index per rank, e.g. {names.one_list}, or one such list per "
            f"replica, spares included, e.g. {names.per_replica}")
    if not isinstance(devices, (list, tuple)) or not devices:
        raise UsageError(what, f"expected a list of CUDA device indexes, got {shown(devices)}",
                         hint)
    nested = [isinstance(d, (list, tuple)) for d in devices]
    if any(nested) and not all(nested):
        raise UsageError(what, f"{shown(devices)} mixes device indexes and lists", hint)
    slots = replicas + spares
    if any(nested) and len(devices) != slots:
        raise UsageError(what, f"{len(devices)} device lists for {slots} replicas ({replicas} "
                         f"serving and {spares} spare(s))", hint)
    lists = [tuple(d) for d in devices] if any(nested) else [tuple(devices)] * slots
    for cuda in lists:
        if len(cuda) != world_size:
            raise UsageError(what, f"{len(cuda)} device(s) {shown(list(cuda))} for {world_size} "
                             f"rank(s) per replica", hint)
        for index in cuda:
            _whole(what, index, least=0)
    for index in (index for cuda in lists for index in cuda):
        if visible == 0:
            raise UsageError(what, f"device {index} was asked for, and no CUDA device is "
                             "visible", f"leave out {what} to run on the CPU (gloo), or run "
                             "where CUDA_VISIBLE_DEVICES names a device")
        if index >= visible:
            raise UsageError(what, f"device {index} is out of range: {_visible(visible)}",
                             "give indexes below that count (CUDA_VISIBLE_DEVICES decides "
                             "which devices are visible, and numbers them from 0)")
    return lists


def _visible(count: int) -> str:
    return "no CUDA device is visible" if count == 0 else \
        f"{count} CUDA device(s) are visible (0 to {count - 1})"


def _whole(what: str, value: Any, least: int = 1) -> int:
    return whole_number(what, value, least,
                        "CUDA device index" if least == 0 else "count of CUDA devices")


def parse_devices(text: str, what: str = CLI_NAMES.devices) -> list[int] | list[list[int]]:
    """``--devices`` as :func:`place` takes it: ``0,1`` -> ``[0, 1]`` (every replica);
    ``0,1/2,3`` -> ``[[0, 1], [2, 3]]`` (one list per replica, spares included).

    Raises:
        UsageError: a part that is not a whole number.
    """
    lists = []
    for part in text.split("/"):
        indexes = []
        for item in part.split(","):
            item = item.strip()
            if not re.fullmatch(r"-?[0-9]+", item, re.ASCII):
                raise UsageError(what, f"{item!r} is not a CUDA device index",
                                 "give indexes such as 0,1, or one list per replica, spares "
                                 "included: 0,1/2,3")
            indexes.append(int(item))
        lists.append(indexes)
    return lists[0] if len(lists) == 1 else lists


def free_slot(taken: Collection[int], slots: int) -> int | None:
    """The lowest of ``slots`` slots that no replica holds (``taken``); None: all are held."""
    return next((slot for slot in range(slots) if slot not in taken), None)


def device() -> Any:
    """``rankguard.device()``: the ``torch.device`` this rank of a pool runs on: ``cuda:N``
    when the pool placed it on a GPU (the worker made it the current device before the
    process group and the setup), else ``cpu`` (also outside a pool's rank)."""
    import torch

    return torch.device(os.environ.get(DEVICE_ENV) or CPU)
