"""torch's NCCL settings that every rank rankguard starts gets (``rankguard run``'s ranks, a
pool's and the pytest plugin's warm ranks) and that ``rankguard.init()`` sets in its own
process (before its NCCL groups form: torch reads them then), each kept where the user set it
(README, "NCCL").

Not ``TORCH_NCCL_ENABLE_TIMING``, which tells a rank whose GPU is stuck before a collective from
a collective stuck in NCCL: it made enqueueing an all_reduce cost 668 us instead of 28 with 400
queued (one H100, ``bench/collective_overhead.py --backend nccl``): the user's to turn on.
"""

from __future__ import annotations

import re
from typing import Mapping

from ..errors import UsageError

NCCL_SETTINGS = {
    # a peer's abort or a remote error only marks the works failed: rankguard's verdict and
    # abort decide, not torch's watchdog, which in modes 1 and 3 kills the process
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
    # torch's heartbeat monitor kills a rank whose watchdog is stuck, or after a dump another
    # rank's timeout asked for, unless its group was aborted: rankguard judges hangs itself
    "TORCH_NCCL_ENABLE_MONITORING": "0",
    # on a failed collective torch's monitor thread dumps the Flight Recorder to
    # /tmp/nccl_trace_rank_R (a predictable name in a world-writable folder), tells every rank
    # of the store to do the same (a replacement joining that store later too), then sleeps
    # TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC (480 s) where the group's destruction joins it:
    # rankguard writes the dump itself, in the run's folder, before it aborts a communicator
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    # and torch's watchdog sleeps four times this (60 s by default) after any failed collective
    # whatever the setting above, while destroying the group waits for the watchdog: a rank
    # whose peer died would stall for a minute in the heal that keeps it
    "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "0",
}


# torch's older names of two of its variables: it reads them too (the newer name wins where
# both are set, so setting the newer one would override the user's older one)
OLDER_NAMES = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "NCCL_ASYNC_ERROR_HANDLING",
               "TORCH_NCCL_ENABLE_TIMING": "NCCL_ENABLE_TIMING"}

# what torchrun's agent gives every rank where its own environment does not set it
# (torch.distributed.elastic's local_elastic_agent): not the user's choice
TORCHRUN_DEFAULTS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def nccl_settings(env: Mapping[str, str]) -> dict[str, str]:
    """torch's NCCL variables for the ranks: :data:`NCCL_SETTINGS`, except where ``env`` (the
    user's) sets one, even to an empty value, or torch's older name of it (then it is left
    out: the user's older name stays in force). Pure."""
    return {name: env.get(name, value) for name, value in NCCL_SETTINGS.items()
            if name in env or OLDER_NAMES.get(name, name) not in env}


def own_settings(env: Mapping[str, str]) -> dict[str, str]:
    """What ``rankguard.init()`` sets in its own process from its environment ``env``: as
    :func:`nccl_settings`, except that under stock torchrun (``TORCHELASTIC_RUN_ID`` set, no
    rankguard launcher) a value torchrun's agent gives where the user set none
    (:data:`TORCHRUN_DEFAULTS`: ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``, in which torch's
    watchdog tears the rank down on a peer's death) is taken for unset. Pure."""
    if "TORCHELASTIC_RUN_ID" in env and "RANKGUARD_LAUNCHER_PID" not in env:
        env = {name: value for name, value in env.items()
               if TORCHRUN_DEFAULTS.get(name) != value}
    return nccl_settings(env)


# torch's spellings of a flag (c10d's getCvarBool: lower-cased, not stripped)
_FLAG = ("1", "0", "true", "false", "t", "f", "yes", "no", "y", "n")
# a number torch's std::stoi reads whole (leading blanks and a sign it takes too)
_INTEGER = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")
_C_INT = range(-(1 << 31), 1 << 31)

# torch's NCCL variables rankguard sets or names (their older names too), and what torch
# takes in each: a flag, or a range of whole numbers
_TAKES: dict[str, tuple[str, ...] | range] = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": range(0, 4),  # its four modes
    "TORCH_NCCL_ENABLE_MONITORING": _FLAG,
    "TORCH_NCCL_DUMP_ON_TIMEOUT": _FLAG,
    "TORCH_NCCL_ENABLE_TIMING": _FLAG,
    "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": range(0, 1 << 31),  # milliseconds
}


def check(env: Mapping[str, str]) -> None:
    """Check the user's values, in ``env``, of torch's NCCL variables that rankguard sets or
    names (and of their older names): torch refuses any other value when a rank forms an NCCL
    group, deep inside ``init_process_group`` (or, for a number with a unit, reads only its
    leading digits); here, before any rank starts. Pure.

    Raises:
        UsageError: naming the variable, its value and what torch takes.
    """
    for name, takes in _TAKES.items():
        for spelt in (name, OLDER_NAMES.get(name)):
            value = env.get(spelt) if spelt is not None else None
            if value is not None:
                _check_one(spelt, value, takes)


def _check_one(name: str, value: str, takes: tuple[str, ...] | range) -> None:
    if isinstance(takes, tuple):
        if value.lower() not in takes:
            raise UsageError(f"{name}={value!r}", "torch refuses it as an NCCL group forms",
                             f"use one of {', '.join(takes)}, or unset it")
        return
    number = int(value) if _INTEGER.fullmatch(value) and int(value) in _C_INT else None
    if number is None or number not in takes:
        raise UsageError(f"{name}={value!r}", f"is not a whole number from {takes.start} to "
                         f"{takes.stop - 1}", f"e.g. {name}={NCCL_SETTINGS.get(name, '0')}, "
                         "or unset it")
