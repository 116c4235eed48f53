"""Injected faults that never fired: what the run says of the ``--inject`` specs it was given.

A fault whose moment never comes (``at=step5`` in a script without ``rankguard.StepLoop``,
``at=step20`` in a loop of steps 0 to 19, a rank that ended first) would leave a run that
"succeeded" as if the fault had been survived. Each rank records in its ledger the faults that
fire, before performing them, and the last ``StepLoop`` step it began (``inject.perform``); the
agent reads that when an attempt ends and before a replacement takes a rank's place
(:class:`Seen`), and :func:`never_fired` decides, once the run is over, which specs fired in no
attempt, saying how far their rank got. It is a report: the run's exit code stays its scripts'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..inject.spec import FaultSpec
from ..records.ledger import InjectionProgress


@dataclass(frozen=True)
class Seen:
    """One process of ``rank`` in ``attempt``, as its ledger showed it at its end."""

    attempt: int
    rank: int
    progress: InjectionProgress


@dataclass(frozen=True)
class NeverFired:
    """A spec that fired in no attempt.

    Attributes:
        spec: the spec, as given.
        attempt: the attempt whose progress ``step`` and ``op`` tell (the last the spec applied
            to), or None when none of the attempts it applies to ran.
        step: the last ``StepLoop`` step its rank began in that attempt (None: none).
        op: its rank's last collective on the default group in that attempt (0: none).
        message: all of it in one line, as the summary prints it.
    """

    spec: FaultSpec
    attempt: int | None
    step: int | None
    op: int
    message: str

    def as_dict(self) -> dict[str, Any]:
        """The journal's ``injection_never_fired`` fields."""
        return {"injection": self.spec.text, "rank": self.spec.rank, "attempt": self.attempt,
                "step": self.step, "op": self.op, "message": self.message}


def never_fired(specs: Sequence[FaultSpec], seen: Sequence[Seen]) -> list[NeverFired]:
    """The specs (``RANKGUARD_INJECT``'s order: a spec's place is its index) that fired in no
    process of ``seen``. A spec whose rank is in none of ``seen`` is left out: with several
    nodes, that rank is another node's, whose agent reports it. Pure."""
    local = {s.rank for s in seen}
    found = []
    for place, spec in enumerate(specs):
        mine = [s for s in seen if s.rank == spec.rank]
        if spec.rank not in local or any(place in s.progress.fired for s in mine):
            continue
        applied = [s for s in mine if spec.attempt is None or s.attempt == spec.attempt]
        if not applied:
            last = max(s.attempt for s in seen)
            found.append(NeverFired(spec, None, None, 0, f"injection {spec.text} never fired "
                                    f"(the run ended after attempt {last})"))
            continue
        attempt = max(s.attempt for s in applied)
        processes = [s.progress for s in applied if s.attempt == attempt]
        steps = [p.step for p in processes if p.step is not None]
        step = max(steps) if steps else None
        op = max(p.op for p in processes)
        found.append(NeverFired(spec, attempt, step, op,
                                f"injection {spec.text} never fired (in attempt {attempt}, "
                                f"{_reached(spec, step, op, processes)})"))
    return found


def _reached(spec: FaultSpec, step: int | None, op: int,
             processes: list[InjectionProgress]) -> str:
    if not any(p.bootstrapped for p in processes):
        return f"rank {spec.rank} recorded nothing: how far it got is not known"
    parts = [f"op {op}" if op else "no collective"]
    if step is not None:
        parts.append(f"step {step}")
    elif spec.at == "step":
        parts.append("no rankguard.StepLoop step")
    return f"rank {spec.rank} reached {' and '.join(parts)}"
