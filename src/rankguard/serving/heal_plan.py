"""What a pool does with a replica after a failed request: a pure function of the request's
verdict (``serving.verdict``) and of what the leader knows of the replica, so that it is proven
as a table, without processes.

What is healthy is kept: a rank's process holds its weights and, on a GPU, its CUDA context,
which cost seconds to minutes to make again. Only the ranks that cannot be reused are replaced.

- **regroup** in place, every process kept: the ranks only raised, and what they raised leaves
  each process usable;
- **drain, then regroup**: the call merely overran its own deadline with no rank to blame,
  or its caller was interrupted mid-call; once every rank finished it, as above (a rank that
  does not finish it within the pool's timeout is then replaced after its stacks, as a hung
  one);
- **replace** the unusable ranks: each gets a new process (its own CUDA context, its own
  setup), which joins a new generation of the survivors; the survivors keep their processes.
  A rank is unusable when it died, raised an error that lost its CUDA context, or ran out
  of GPU memory;
- **stacks, then replace**: a hang (a stopped rank, or one blamed at the deadline): where each
  culprit was stuck goes to the journal, then the culprits are replaced; the ranks that only
  waited for them (the verdict's victims) are kept;
- **stacks, then kill**: a hang whose culprits are every rank: nothing is left to keep;
- **kill**: no rank is worth keeping (every one is unusable): a fresh replica is cheaper.

An error leaves a process unusable when CUDA says its context is lost: a *sticky* error (an
illegal address, a device-side assert, a launch failure, ...) fails every later CUDA call of
that process, so regrouping it would fail again. A CUDA out-of-memory error is not sticky, but
its process is replaced all the same: the memory its caching allocator reserved before the
failure stays reserved (free to no other process on the device), and whatever the user's
code keeps from the failed step is unknown; a new process gives the device back its level
from before the fault, and costs a warm spare's join (0.45 s on an H200), not a reload of the
other ranks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

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
    REPLACE = "replace"
    STACKS_THEN_REPLACE = "stacks_then_replace"
    STACKS_THEN_KILL = "stacks_then_kill"
    KILL = "kill"


@dataclass(frozen=True)
class HealPlan:
    """:func:`heal`'s decision: the action, and the ranks whose processes go (every rank for
    a kill, none for a regroup)."""

    action: Heal
    replace: frozenset[int]


def context_lost(error_type: str | None, detail: str) -> bool:
    """Whether a rank's error (its class name and text) says its CUDA context is lost. Pure."""
    if error_type is None:
        return False
    text = detail.lower()
    return any(sticky.lower() in text for sticky in STICKY_CUDA_ERRORS)


def out_of_memory(error_type: str | None, detail: str) -> bool:
    """Whether a rank's error (its class name and text) is CUDA's out-of-memory error
    (``torch.OutOfMemoryError``: ``CUDA out of memory. Tried to allocate ...``). Pure."""
    if error_type is None:
        return False
    return error_type == "OutOfMemoryError" or "cuda out of memory" in detail.lower()


def heal(fault: RequestFailed, world: int, dead: frozenset[int]) -> HealPlan:
    """What to do with a replica of ``world`` ranks after ``fault``; ``dead``: its ranks whose
    process is gone. Pure."""
    everyone = frozenset(range(world))
    culprit = frozenset() if fault.rank is None else frozenset({fault.rank})
    if fault.cause == RequestCause.RAISED:
        unusable = (context_lost(fault.error_type, fault.detail)
                    or out_of_memory(fault.error_type, fault.detail))
        lost = culprit if unusable else frozenset()
        return _keeping(dead | lost, everyone, Heal.REPLACE, Heal.REGROUP)
    if fault.cause == RequestCause.DEADLINE and fault.rank is None:
        # every rank still running it (or the caller interrupted mid-call): let them finish
        return _keeping(dead, everyone, Heal.REPLACE, Heal.DRAIN_THEN_REGROUP)
    if fault.cause in (RequestCause.FROZEN, RequestCause.DEADLINE):
        # the victims waited for the culprits; a rank neither is was still running too
        kept = frozenset(fault.victims) & everyone
        return _keeping(everyone - kept | dead | culprit, everyone, Heal.STACKS_THEN_REPLACE,
                        Heal.REGROUP, gone_all=Heal.STACKS_THEN_KILL)
    return _keeping(dead | culprit, everyone, Heal.REPLACE, Heal.REGROUP)


def idle_heal(world: int, dead: frozenset[int]) -> HealPlan:
    """What to do with a replica of ``world`` ranks that ran no call when ranks ``dead``
    died: replace them, keeping the others; kill it when none is left. Pure."""
    return _keeping(dead, frozenset(range(world)), Heal.REPLACE, Heal.REGROUP)


def stopped_heal(world: int, stopped: frozenset[int]) -> HealPlan:
    """What to do with a replica of ``world`` ranks whose ranks ``stopped`` were found stopped
    (SIGSTOP) as it was about to serve again: their stacks, then replace them; every rank
    stopped: stacks, then kill. Pure."""
    return _keeping(stopped, frozenset(range(world)), Heal.STACKS_THEN_REPLACE, Heal.REGROUP,
                    gone_all=Heal.STACKS_THEN_KILL)


def _keeping(unusable: frozenset[int], everyone: frozenset[int], replace: Heal, none: Heal,
             gone_all: Heal = Heal.KILL) -> HealPlan:
    """``replace`` the ``unusable`` ranks; ``none`` when there are none; ``gone_all`` when
    nothing is left to keep."""
    unusable &= everyone
    if not unusable:
        return HealPlan(none, frozenset())
    if unusable == everyone:
        return HealPlan(gone_all, everyone)
    return HealPlan(replace, unusable)
