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


def nccl_settings(env: Mapping[str, str]) -> dict[str, str]:
    """torch's NCCL variables for the ranks: :data:`NCCL_SETTINGS`, except where ``env`` (the
    user's) sets one, even to an empty value. Pure."""
    return {name: env.get(name, value) for name, value in NCCL_SETTINGS.items()}


# torch's spellings of a flag (c10d's getCvarBool, case-insensitive)
_FLAG = ("1", "0", "true", "false", "t", "f", "yes", "no", "y", "n")
_WHOLE = re.compile(r"[0-9]{1,9}")  # a C int that torch's std::stoi reads whole

# torch's NCCL variables rankguard sets or names, and what torch takes in each
_TAKES = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("0", "1", "2", "3"),
    "TORCH_NCCL_ENABLE_MONITORING": _FLAG,
    "TORCH_NCCL_DUMP_ON_TIMEOUT": _FLAG,
    "TORCH_NCCL_ENABLE_TIMING": _FLAG,
    "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": None,  # a whole number of milliseconds
}


def check(env: Mapping[str, str]) -> None:
    """Check the user's values, in ``env``, of torch's NCCL variables that rankguard sets or
    names: torch refuses any other value (or reads only its leading digits) when a rank forms
    an NCCL group, deep inside ``init_process_group``; here, before any rank starts. Pure.

    Raises:
        UsageError: naming the variable, its value and what torch takes.
    """
    for name, takes in _TAKES.items():
        value = env.get(name)
        if value is None:
            continue
        if takes is None:
            if not _WHOLE.fullmatch(value.strip()):
                raise UsageError(f"{name}={value!r}", "is not a whole number of milliseconds",
                                 f"e.g. {name}={NCCL_SETTINGS[name]}, or unset it")
        elif value.strip().lower() not in takes:
            raise UsageError(f"{name}={value!r}", "torch refuses it as an NCCL group forms",
                             f"use one of {', '.join(takes)}, or unset it")
