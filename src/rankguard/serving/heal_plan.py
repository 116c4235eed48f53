"""What a pool does with a replica after a failed request: a pure function of the request's
verdict (``serving.verdict``) and of what the leader knows of the replica, so that it is proven
as a table, without processes.

- **regroup** in place, every process kept (its weights, and on a GPU its CUDA context): the
  ranks only raised, and what they raised leaves a process usable;
- **drain, then regroup**: the call merely overran its own deadline with no rank to blame;
  once every rank finished it, as above;
- **stacks, then kill**: a hang (a stopped rank, or one blamed at the deadline): where each
  rank was stuck goes to the journal first;
- **kill**: a rank died, or raised an error that leaves its process unusable.

An error leaves a process unusable when CUDA says its context is lost: a *sticky* error (an
illegal address, a device-side assert, a launch failure, ...) fails every later CUDA call of
that process, so regrouping it would fail again. A CUDA out-of-memory error is not sticky: the
allocator has freed what the failed step held, and the process goes on.
"""

from __future__ import annotations

import enum

from ..errors import RequestCause, RequestFailed

# The texts of CUDA's sticky errors as torch reports them (``CUDA error: <text>``, from
# ``cudaGetErrorString``); any of them in a rank's error means its CUDA context is lost.
STICKY_CUDA_ERRORS = (
    "an illegal memory access was encountered",
    "device-side assert triggered",
    "unspecified launch failure",
    "misaligned address",
    "an illegal instruction was encountered",
    "invalid program counter",
    "hardware stack error",
    "uncorrectable ECC error encountered",
    "the launch timed out and was terminated",
    "operation not permitted when stream is capturing",
)


class Heal(enum.StrEnum):
    """What the pool does with a replica after a failed request (journal: ``group_retire``'s
    ``action``)."""

    REGROUP = "regroup"
    DRAIN_THEN_REGROUP = "drain_then_regroup"
    STACKS_THEN_KILL = "stacks_then_kill"
    KILL = "kill"


def context_lost(error_type: str | None, detail: str) -> bool:
    """Whether a rank's error (its class name and text) says its CUDA context is lost. Pure."""
    if error_type is None:
        return False
    text = detail.lower()
    return any(sticky.lower() in text for sticky in STICKY_CUDA_ERRORS)


def heal(fault: RequestFailed, all_alive: bool, interrupted: bool) -> Heal:
    """What to do with a replica after ``fault``; ``all_alive``: every rank's process still
    runs; ``interrupted``: the leader was interrupted in the call (its ranks may be mid-way
    through it). Pure."""
    if fault.cause == RequestCause.RAISED:
        usable = all_alive and not context_lost(fault.error_type, fault.detail)
        return Heal.REGROUP if usable else Heal.KILL
    if fault.cause == RequestCause.DEADLINE and fault.rank is None and not interrupted:
        return Heal.DRAIN_THEN_REGROUP
    if fault.cause in (RequestCause.FROZEN, RequestCause.DEADLINE):
        return Heal.STACKS_THEN_KILL
    return Heal.KILL
