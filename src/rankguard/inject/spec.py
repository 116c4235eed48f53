"""The fault-injection grammar: which fault, on which rank, at which moment.

A spec is ``KIND[:ARG]:OPTIONS`` where OPTIONS are comma-separated ``key=value`` pairs::

    hang:rank=2,at=op30          rank 2 sleeps forever before its 30th collective
    crash:7:rank=1,at=init       rank 1 exits with code 7 inside init_process_group
    slow:60:rank=0,at=op10       rank 0 is busy for 60 s before its 10th collective, then goes on
    kill:rank=3,at=2.5s          rank 3 is SIGKILLed 2.5 s after it started
    stop:rank=1,at=op5,attempt=any   in every attempt, not only the first

Kinds:

- ``crash[:CODE]``  exit at once with CODE (default 1), without cleanup
- ``raise``         raise :class:`InjectedFault` in the main thread
- ``kill``          SIGKILL to itself
- ``term``          SIGTERM to itself
- ``stop``          SIGSTOP to itself (frozen until killed)
- ``hang``          the main thread sleeps forever (no CPU, no progress)
- ``gil[:SECONDS]`` a C-level loop that holds the GIL for about SECONDS (default: for good);
                    busy, not frozen
- ``slow:SECONDS``  a Python busy loop for SECONDS, then the rank goes on

Moments (``at=``):

- ``start``   before the user's script runs
- ``init``    in ``init_process_group``, before the rendezvous
- ``opN``     before the N-th collective on the default group (N >= 1)
- ``stepN``   before a ``rankguard.StepLoop`` runs step N (the number its step function
              receives, from 0), once
- ``Ts``      T seconds (a decimal) after the rank started

``attempt=`` picks the restart attempt it applies to: a number (default 0, the first attempt)
or ``any``. ``rank=`` is the global rank and is required.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import RankguardError, UsageError
from ..inputs.options import number

KINDS = ("crash", "raise", "kill", "term", "stop", "hang", "gil", "slow")
_TAKES_SECONDS = ("gil", "slow")
_AT = re.compile(r"(?:(start|init)|op([0-9]+)|step([0-9]+)|([0-9]+(?:\.[0-9]*)?)s)",
                 re.ASCII)
_DIGITS = re.compile(r"[0-9]+", re.ASCII)


class InjectedFault(RankguardError):
    """Raised in a rank by a ``raise`` fault injection."""


@dataclass(frozen=True)
class FaultSpec:
    """One parsed ``--inject`` spec."""

    kind: str
    rank: int
    at: str  # "start", "init", "op", "step" or "time"
    op: int = 0  # for at == "op", and the step for at == "step"
    seconds: float = 0.0  # for at == "time"
    arg: float | None = None  # crash code, or seconds of gil/slow
    attempt: int | None = 0  # None: every attempt
    text: str = ""

    def applies_to(self, rank: int, attempt: int) -> bool:
        return self.rank == rank and (self.attempt is None or self.attempt == attempt)


def parse(text: str, *, what: str = "--inject", moment: str | None = None) -> FaultSpec:
    """Parse one spec.

    ``moment``: for callers that perform the fault themselves at a moment of their own (the
    serving example injects mid-forward, ``moment="now"``): ``at=`` and ``attempt=`` are then
    refused, since no other moment would be kept to and such a caller has no attempts.
    ``what``: the name of the input, for errors.

    Raises:
        UsageError: the spec does not follow the grammar; the message says which part.
    """

    def _bad(text: str, problem: str) -> UsageError:
        example = "hang:rank=2,at=op30" if moment is None else "stop:rank=1"
        return UsageError(what, f"{problem} in {text!r}",
                          f"write KIND[:ARG]:rank=R{',at=WHEN' if moment is None else ''}, "
                          f"e.g. {example}")

    def _value(part: str, value: str, kind: type, minimum: int = 0,
               maximum: int | None = None) -> float:
        # through the check every numeric option gets: plain digits, finite, bounded
        try:
            return number(part, value, kind, minimum, "", maximum)
        except UsageError as error:
            raise _bad(text, f"{part} {error.problem}") from None

    parts = text.strip().split(":")
    kind = parts[0]
    if kind not in KINDS:
        raise _bad(text, f"unknown kind {kind!r} (kinds: {', '.join(KINDS)})")
    arg_text = None
    if len(parts) == 3:
        arg_text, options = parts[1], parts[2]
    elif len(parts) == 2:
        options = parts[1]
    else:
        raise _bad(text, "expected KIND[:ARG]:OPTIONS")
    arg = None
    if arg_text is not None:
        if kind not in ("crash", *_TAKES_SECONDS):
            raise _bad(text, f"kind {kind!r} takes no argument")
        arg = (_value("exit code", arg_text, int, 1, 255) if kind == "crash"
               else _value("seconds", arg_text, float))
    elif kind == "slow":
        raise _bad(text, "kind 'slow' needs SECONDS, e.g. slow:30:rank=0,at=op5")

    fields: dict[str, str] = {}
    for item in options.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in ("rank", "at", "attempt"):
            raise _bad(text, f"option {item!r} is not rank=, at= or attempt=")
        if key in fields:
            raise _bad(text, f"option {key}= is given twice")
        fields[key] = value.strip()
    if moment is not None:
        for own in ("at", "attempt"):  # the caller's moment is one, in no attempt of a run
            if own in fields:
                raise _bad(text, f"{own}={fields[own]} is not taken here (the caller performs "
                           f"the fault {moment})")
        fields["at"] = moment
    if "rank" not in fields or "at" not in fields:
        raise _bad(text, "both rank= and at= are required")
    if not _DIGITS.fullmatch(fields["rank"]):
        raise _bad(text, f"rank={fields['rank']!r} is not a rank number")
    match = _AT.fullmatch(fields["at"])
    if fields["at"] == moment:
        word, op, step, seconds = moment, None, None, None
    elif not match:
        raise _bad(text, f"at={fields['at']!r} is not start, init, opN, stepN or a time like 2.5s")
    else:
        word, op, step, seconds = match.groups()
    if op is not None and _value("op", op, int) < 1:
        raise _bad(text, "collectives are counted from op1")
    counted, counts = (op, "op") if op is not None else (step, "step")
    attempt_text = fields.get("attempt", "0")
    if attempt_text == "any":
        attempt = None
    elif _DIGITS.fullmatch(attempt_text):
        attempt = int(_value("attempt", attempt_text, int))
    else:
        raise _bad(text, f"attempt={attempt_text!r} is not a number or 'any'")
    return FaultSpec(
        kind=kind,
        rank=int(_value("rank", fields["rank"], int)),
        at=word or (counts if counted is not None else "time"),
        op=int(_value(counts, counted, int)) if counted is not None else 0,
        seconds=_value("time", seconds, float) if seconds is not None else 0.0,
        arg=arg,
        attempt=attempt,
        text=text.strip(),
    )


def encode(specs: list[FaultSpec]) -> str:
    """The specs as one environment value (the rank parses it back with :func:`decode`)."""
    return ";".join(spec.text for spec in specs)


def decode(value: str) -> list[FaultSpec]:
    return [parse(text) for text in value.split(";") if text.strip()]
