"""A pool's options (``rankguard.Pool``'s arguments), checked once into one frozen
:class:`PoolOptions`, with the defaults that derive from others (``suspect_after``,
``max_queue``, ``min_call_s``) and where each replica slot runs (``serving.placement``)."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError, shown
from ..inputs.options import (MAX_LOCAL_RANKS, check_ranks_env, seconds,
                              whole_number, writable_dir)
from ..records import private_files
from .budgets import MIN_CALL_FRACTION, SUSPECT_FRACTION
from .placement import POOL_NAMES, Backend, Names, ReplicaPlacement, place

QUEUE_PER_REPLICA = 32  # the default bound on the calls waiting for a replica, per replica
MAX_QUEUE = 10_000  # calls that may wait at most, whatever max_queue asks


class HealingMode(enum.StrEnum):
    """What a call does when no replica is ready (``Pool(on_healing=)``)."""

    WAIT = "wait"  # wait for one within its deadline
    FAIL = "fail"  # raise PoolUnavailable at once


HEALING_MODES = tuple(mode.value for mode in HealingMode)


@dataclass(frozen=True)
class PoolOptions:
    """What ``rankguard.Pool`` was asked for, checked; the meaning of each is on ``Pool``.
    Build it with :meth:`checked`."""

    world_size: int
    setup: Callable[[int, int], Any] | None
    spares: int
    timeout: float
    replicas: int
    suspect_after: float
    max_queue: int
    on_healing: HealingMode
    start_timeout: float
    max_backoff: float
    journal: str | None
    log_dir: str | None  # None: a temporary folder of the pool's own
    env: Mapping[str, str]
    zygote: bool
    placement: tuple[ReplicaPlacement, ...]  # slot -> where its ranks run (replicas + spares)
    warm_spares: int  # warm spare rank processes kept per device the replicas use

    @property
    def warm_devices(self) -> tuple[str, ...]:
        """The devices to keep ``warm_spares`` warm spare ranks on: every device a replica
        slot uses, in order."""
        if not self.warm_spares:
            return ()
        return tuple(dict.fromkeys(d for slot in self.placement for d in slot.devices))

    @property
    def backend(self) -> Backend:
        """The replicas' process group backend: ``nccl`` on CUDA devices, else ``gloo``."""
        return self.placement[0].backend

    @property
    def min_call_s(self) -> float:
        """The least time a call must have left to start on a replica: a tenth of
        ``timeout``."""
        # rounded: 3 s x 0.1 is 0.30000000000000004, and a deadline of 0.3 s must be allowed
        return round(self.timeout * MIN_CALL_FRACTION, 9)

    @classmethod
    def checked(cls, world_size: int, setup: Callable[[int, int], Any] | None, *,
                spares: int, timeout: float, replicas: int, suspect_after: float | None,
                max_queue: int | None, on_healing: str, start_timeout: float,
                max_backoff: float, journal: str | None, log_dir: str | None,
                env: Mapping[str, str] | None, zygote: bool, devices: Any,
                gpus_per_replica: Any, warm_spares: Any) -> PoolOptions:
        """The options ``Pool(...)`` was given (its defaults are its own), checked, with the
        ones derived from them. A ``log_dir`` is created if missing. torch is imported (to
        count the visible CUDA devices) only when ``devices`` or ``gpus_per_replica`` is given.
        ``warm_spares`` None: one per device on GPUs, none on the CPU (a rank forked from the
        zygote starts in milliseconds there).

        Raises:
            UsageError: a bad argument, naming it and the fix.
        """
        check_size(world_size, spares, replicas)
        placement = placed(devices, gpus_per_replica, world_size, replicas, spares)
        if not isinstance(zygote, bool):
            raise UsageError("Pool(zygote)", f"expected True or False, got {shown(zygote)}")
        limit = seconds("Pool(timeout)", timeout)
        suspect = limit * SUSPECT_FRACTION if suspect_after is None else \
            seconds("Pool(suspect_after)", suspect_after)
        if suspect > limit:
            raise UsageError("Pool(suspect_after)", f"{suspect:g} s is longer than the pool's "
                             f"timeout of {limit:g} s", "give at most the timeout")
        queue = QUEUE_PER_REPLICA * replicas if max_queue is None else \
            whole_number("Pool(max_queue)", max_queue, 0)
        if queue > MAX_QUEUE:
            raise UsageError("Pool(max_queue)", f"{shown(queue)} is above {MAX_QUEUE}",
                             "each waiting call holds a thread (rankguard serve's, or the "
                             "caller's): queue at most that many")
        start = seconds("Pool(start_timeout)", start_timeout)
        backoff = seconds("Pool(max_backoff)", max_backoff)
        if on_healing not in HEALING_MODES:
            raise UsageError("Pool(on_healing)", f"{on_healing!r} is not one of "
                             f"{', '.join(HEALING_MODES)}")
        if setup is not None and not callable(setup):
            raise UsageError("Pool(setup)", f"{setup!r} is not callable")
        if log_dir:
            log_dir = writable_dir("Pool(log_dir)", log_dir)
            private_files.check_own(log_dir, "Pool(log_dir)")
        extra_env = checked_env(env)
        ranks_env = {**os.environ, **extra_env}
        check_ranks_env(ranks_env)
        warm = (0 if placement[0].cuda is None else 1) if warm_spares is None else \
            whole_number("Pool(warm_spares)", warm_spares, 0)
        if warm > MAX_LOCAL_RANKS:
            raise UsageError("Pool(warm_spares)", f"{shown(warm)} is above {MAX_LOCAL_RANKS}",
                             f"start at most {MAX_LOCAL_RANKS} rank processes on one machine")
        return cls(world_size, setup, spares, limit, replicas, suspect, queue,
                   HealingMode(on_healing), start, backoff, journal or None, log_dir or None,
                   extra_env, zygote, placement, warm)


def checked_env(env: Any) -> dict[str, str]:
    """``Pool(env=)``: variables added to the ranks' environment, checked as ``os.environ``
    would take them (a name that is a non-empty string without ``=`` or a NUL, a value that is
    a string without a NUL).

    Raises:
        UsageError: ``env`` is not a mapping, or one of its entries is not such a variable.
    """
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise UsageError("Pool(env)", f"expected a dict of names to values, got {shown(env)}",
                         "e.g. env={'NCCL_DEBUG': 'WARN'}")
    for name, value in env.items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise UsageError("Pool(env)", f"{shown(name)} is not a variable name",
                             "give names of letters, digits and underscores")
        if not isinstance(value, str) or "\0" in value:
            raise UsageError("Pool(env)", f"the value of {name} is {shown(value)}, not a "
                             "string without NUL characters", f"e.g. env={{{name!r}: '1'}}")
    return dict(env)


def placed(devices: Any, gpus_per_replica: Any, world_size: int, replicas: int, spares: int,
           names: Names = POOL_NAMES) -> tuple[ReplicaPlacement, ...]:
    """``serving.placement.place`` with this machine's count of visible CUDA devices, read (and
    torch imported) only when a device option is given.

    Raises:
        UsageError: a bad placement, naming the option (as ``names`` calls it) and the fix.
    """
    asked = devices is not None or gpus_per_replica is not None
    return place(devices, gpus_per_replica, world_size, replicas, spares,
                 _visible_cuda_devices() if asked else None, names)


def _visible_cuda_devices() -> int:
    import torch

    return torch.cuda.device_count()


def check_size(world_size: Any, spares: Any, replicas: Any = 1,
               names: tuple[str, str, str] = ("Pool(world_size)", "Pool(spares)",
                                              "Pool(replicas)")) -> None:
    """Refuse a pool size that is not whole numbers (``world_size`` >= 1, ``spares`` >= 0,
    ``replicas`` >= 1), or whose ``world_size * (replicas + spares)`` rank processes exceed
    ``MAX_LOCAL_RANKS`` on this machine; ``names``: how the caller calls the three
    (``--world-size``, ``--spares``, ``--replicas``).

    Raises:
        UsageError: naming the value and the fix.
    """
    for what, value, least in ((names[0], world_size, 1), (names[1], spares, 0),
                               (names[2], replicas, 1)):
        whole_number(what, value, least)
        if value > MAX_LOCAL_RANKS:
            raise UsageError(what, f"{shown(value)} is above {MAX_LOCAL_RANKS}",
                             f"start at most {MAX_LOCAL_RANKS} rank processes on one machine")
    groups = replicas + spares
    if world_size * groups > MAX_LOCAL_RANKS:
        raise UsageError(f"{names[0]}, {names[1]} and {names[2]}",
                         f"{world_size} ranks per replica x {groups} replicas ({replicas} "
                         f"serving and {spares} spare(s)) is more than {MAX_LOCAL_RANKS} rank "
                         "processes", f"start at most {MAX_LOCAL_RANKS} rank processes on one "
                         "machine")


