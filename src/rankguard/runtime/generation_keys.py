"""The store keys of one generation of the default group, and its outcome, decided once.

Every member of generation N (survivors and replacements alike) meets at its **join barrier**;
then the first member to write the **outcome** (by compare-and-set, sealed with the run's
secret) decides for all whether N formed or failed, and for want of which members. A member's
own view of the barrier may differ from the decision (it read the last arrival just before its
deadline, another member gave up just after its own): every member acts on the decision, so
that no member creates a group its peers abandoned.
"""

from __future__ import annotations

import json
from typing import Any

from ..deadline import Deadline
from ..store import sealed
from . import barrier


def prefix(number: int) -> str:
    """The store prefix of generation ``number``'s keys (under the lineage's root store)."""
    return f"rankguard/gen{number}/"


def join_barrier(number: int) -> str:
    """The barrier at which generation ``number``'s members, replacements included, meet."""
    return f"{prefix(number)}joined"


def formed(client: Any, number: int) -> bool:
    """Whether every member of generation ``number`` arrived at its join barrier (whether or not
    its outcome is decided yet)."""
    return bool(client.check([barrier.released_key(join_barrier(number))]))


def failed_for(client: Any, number: int) -> list[int] | None:
    """The members (new numbering) that generation ``number`` failed for want of, if a member
    decided that it failed; None if it formed, or is undecided (a forged outcome is ignored)."""
    key = _outcome_key(number)
    if not client.check([key]):
        return None
    text = sealed.unseal(key, client.get(key))
    return None if text is None else json.loads(text)


def decide(client: Any, number: int, missing: list[int] | None, limit: Deadline
           ) -> list[int] | None:
    """Generation ``number``'s outcome: the first one written (this member's view, ``missing``:
    None if every member arrived, if it is the first); by ``limit``, else this member's view.
    Returns the members it failed for want of, or None if it formed."""
    decided = first_authentic(client, _outcome_key(number), json.dumps(missing), limit)
    return missing if decided is None else json.loads(decided)


def others_missing(missing: list[int], own: int) -> tuple[list[int], bool]:
    """A decision's ``missing`` places as one member tells it: the other places, and whether its
    own is among them (it arrived, but after the member that decided had given up on it: an
    error must not name the rank that raises it as the one that did not arrive)."""
    return [place for place in missing if place != own], own in missing


def first_authentic(client: Any, key: str, value: str, limit: Deadline) -> str | None:
    """The first authentic value written in ``key`` (``value`` if it is this rank's); None if
    none could be agreed by ``limit``. A forged value found there is replaced by
    compare-and-set; each try is one round trip to the store."""
    ours = sealed.seal(key, value)
    current_value = client.compare_set(key, "", ours)
    while True:
        text = sealed.unseal(key, current_value)
        if text is not None:
            return text
        if limit.passed():
            return None
        current_value = client.compare_set(key, current_value, ours)  # the forged value only


def _outcome_key(number: int) -> str:
    return f"{prefix(number)}outcome"
