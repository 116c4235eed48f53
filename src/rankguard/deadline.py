"""Deadlines: one instant on the monotonic clock, passed as is to wherever a wait is enforced.

A relative timeout (``Pool.run(timeout=5)``, ``--hang-timeout 3``, a test's deadline) is checked
once, at the edge, by :func:`check_seconds`, and becomes a :class:`Deadline` there. Every layer
below receives that value and asks it how much time is left; none re-derives the instant from a
timeout of its own. A step that must end sooner takes a shorter deadline from it
(:meth:`Deadline.within`), so the earliest always wins.

A Deadline crosses processes unchanged (it pickles as its instant): ``CLOCK_MONOTONIC`` is one
clock for the whole machine on Linux, so a rank process reads the same instant its leader set.

This module is at the bottom of the package: it imports nothing of rankguard but the errors.
"""

from __future__ import annotations

import math
import numbers
import time

from .errors import UsageError, shown

# Past ~9.2e9 s the platform's and gloo's timers overflow; no real budget comes near this.
MAX_SECONDS = 1e9


def check_seconds(what: str, value: object, *, zero: bool = False, infinite: bool = False,
                  least: float = 0.0, most: float = MAX_SECONDS, text: bool = True,
                  hint: str | None = None) -> float:
    """``value`` as a number of seconds, or UsageError naming ``what``.

    The one rule for every duration rankguard takes (Python arguments, flags, headers,
    environment variables). Accepts an int, a float, or (``text``) the text of a decimal number.
    Refuses booleans, NaN, negative numbers, zero unless ``zero``, values below ``least``,
    infinity unless ``infinite``, and finite values above ``most`` (at most ``MAX_SECONDS``,
    past which the platform's and gloo's timers overflow).

    Args:
        hint: how to fix a refused value, for the message; by default the rule in words. A
            caller that parses text more strictly first (``options.number``) passes its own.

    Raises:
        UsageError: ``value`` is not a number of seconds in the allowed range.
    """
    def refuse(problem: str, fix: str | None = None) -> UsageError:
        rule = (f"give at least {least:g} seconds" if least > 0 else
                "give zero or more seconds" if zero else "give a positive number of seconds")
        return UsageError(what, problem, hint if hint is not None else fix or rule)

    kinds = (numbers.Real, str) if text else (numbers.Real,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise refuse(f"expected a number of seconds, got {shown(value)}",
                     "give an int or a float, e.g. 5.0")
    most = min(most, MAX_SECONDS)
    try:
        seconds = float(value.strip() if isinstance(value, str) else value)
    except OverflowError:  # an int too large for a float
        raise refuse(f"{shown(value)} is above {most:.10g}", f"give at most {most:.10g}"
                     ) from None
    except ValueError:
        raise refuse(f"expected a number of seconds, got {shown(value)}") from None
    if isinstance(value, str) and "_" in value:
        raise refuse(f"expected a number of seconds, got {value!r}")
    if math.isnan(seconds):
        raise refuse(f"{value!r} is not a number")
    if seconds < least or seconds < 0:
        raise refuse(f"{value!r} is below {max(least, 0.0):g}")
    if seconds == 0 and not zero:
        raise refuse(f"{value!r} is not above 0")
    if math.isinf(seconds):
        if infinite:
            return seconds
        raise refuse(f"{value!r} is not a finite number of seconds")
    if seconds > most:
        raise refuse(f"{shown(value)} is above {most:.10g}", f"give at most {most:.10g}")
    return seconds


class Deadline:
    """An absolute instant on the monotonic clock, and the budget it was made from.

    Immutable. ``seconds`` is kept for messages ("did not complete within 5 s"); the instant
    ``at`` is what every wait reads. ``Deadline.never()`` is the instant that never comes.
    """

    __slots__ = ("at", "seconds")

    def __init__(self, at: float, seconds: float) -> None:
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "seconds", seconds)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Deadline is immutable")

    def __reduce__(self) -> tuple[type, tuple[float, float]]:
        return (Deadline, (self.at, self.seconds))

    def __repr__(self) -> str:
        return f"Deadline(remaining={self.remaining():.3f}s of {self.seconds:g}s)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Deadline) and (self.at, self.seconds) == (other.at, other.seconds)

    def __hash__(self) -> int:
        return hash((self.at, self.seconds))

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        """``seconds`` from now (already checked: see :func:`check_seconds`)."""
        return cls(time.monotonic() + seconds, seconds)

    @classmethod
    def never(cls) -> Deadline:
        """A deadline that never passes."""
        return cls(math.inf, math.inf)

    def remaining(self) -> float:
        """Signed seconds left: negative once it has passed, ``inf`` for :meth:`never`. For
        arithmetic and messages; a wait takes :meth:`wait_time`."""
        return self.at - time.monotonic()

    def passed(self) -> bool:
        """Whether the instant has come."""
        return time.monotonic() >= self.at

    def within(self, seconds: float) -> Deadline:
        """The earlier of this deadline and ``seconds`` from now: the bound of a step."""
        step = Deadline.after(seconds)
        return step if step.at < self.at else self

    def sooner(self, other: Deadline | None) -> Deadline:
        """The earlier of the two (``self`` when ``other`` is None)."""
        return other if other is not None and other.at < self.at else self

    def later(self, seconds: float) -> Deadline:
        """This deadline moved ``seconds`` later: for time that must not count against it
        (a watchdog paused while work with a bound of its own runs)."""
        return Deadline(self.at + seconds, self.seconds)

    def before(self, margin: float) -> Deadline:
        """This deadline moved ``margin`` seconds earlier: leaves the caller time to act after
        the step it bounds gives up (for example to send the error back)."""
        return Deadline(self.at - margin, self.seconds)

    def wait_time(self, cap: float | None = None, *, at_least: float = 0.0) -> float:
        """What to hand a call that waits (``select``, ``Condition.wait``, a store's or gloo's
        timeout): the seconds left, never below ``at_least`` (0 by default; a floor for APIs
        that refuse 0 or less) and never above ``cap`` (None: no cap). ``inf`` for
        :meth:`never` when there is no cap."""
        left = max(self.at - time.monotonic(), at_least)
        return left if cap is None else min(left, cap)

    def wait_time_or_none(self) -> float | None:
        """:meth:`wait_time` for the calls that refuse infinity but take None as "no limit"
        (``select``, ``Condition.wait``, ``Thread.join``): None for :meth:`never`."""
        left = self.wait_time()
        return None if math.isinf(left) else left
