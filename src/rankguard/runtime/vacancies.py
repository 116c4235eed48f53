"""Vacancies: a generation that keeps its size, and the replacement processes that fill it.

``regroup(keep_size=True)`` forms the next generation with every surviving rank in its place and
each failed rank's place **vacant**. The survivors publish it in the store's **lineage record**
(``rankguard/lineage``, sealed with the run's secret): the generation's number, its size, its
vacant places and the wall-clock time until which its members wait for them. A generation's
record replaces an older one only (compare-and-set on the number), so a slow survivor never
hides a newer generation.

A **replacement** is a new process started with ``RANKGUARD_REPLACING=1`` and the ``RANK`` of
the place it fills (``rankguard run --recovery in-place`` starts them; under another launcher
the user does). When its script calls ``init_process_group``, :func:`join` finds the newest
generation with that place vacant, marks its arrival at the generation's join barrier beside the
survivors, and the default group is created on that generation's keys. A generation whose members
stopped waiting (a replacement that came too late, a member that died meanwhile) is passed over
for the next one the survivors form, until the replacement's own deadline; having arrived once,
the replacement is one of that next generation's members.

A launcher that will **not** fill a place (``rankguard run --recovery in-place`` refused to
repair the fault: a usage error, no restarts left, see ``launcher.replace_rules``) says so in
each survivor's ledger with its notice (:func:`refusal`): a survivor waiting for that place stops
at once, and its generation fails naming the refusal, instead of waiting out its timeout.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..store import sealed
from ..deadline import Deadline, check_seconds
from ..errors import CollectiveTimeout, UsageError
from . import barrier, generation_keys
from .state import WORLD, current

LINEAGE_KEY = "rankguard/lineage"
REPLACING_ENV = "RANKGUARD_REPLACING"
JOIN_TIMEOUT_ENV = "RANKGUARD_REPLACE_TIMEOUT"
JOIN_TIMEOUT_S = 60.0  # a replacement's default: a cold one imports torch meanwhile
# A replacement waits for as long as two generations' joins: when a second rank fails while the
# survivors wait for the first one's replacement, their join fails at its timeout and the next
# generation, with both places vacant, is the one the replacement joins.
REPLACEMENT_WAITS = 2
_POLL_S = 0.05  # between reads of the lineage record while no usable generation is there
_ARRIVE_MARGIN_S = 0.5  # a place is taken only this long before its generation stops waiting


@dataclass(frozen=True)
class Vacancies:
    """A generation's lineage record: what a replacement needs to join it.

    Attributes:
        generation: its number.
        size: how many ranks it has (the places, vacant or not).
        vacant: the places no survivor holds.
        until: wall-clock time (``time.time()``) at which its members stop waiting.
    """

    generation: int
    size: int
    vacant: tuple[int, ...]
    until: float

    def text(self) -> str:
        return json.dumps({"generation": self.generation, "size": self.size,
                           "vacant": list(self.vacant), "until": self.until})

    @classmethod
    def parse(cls, text: str | None) -> "Vacancies | None":
        """The record in an authentic value, or None for none or a malformed one."""
        if text is None:
            return None
        try:
            fields = json.loads(text)
            return cls(int(fields["generation"]), int(fields["size"]),
                       tuple(int(place) for place in fields["vacant"]), float(fields["until"]))
        except (ValueError, TypeError, KeyError):
            return None


def group_store(number: int, root: Any) -> Any:
    """The store generation ``number``'s default group is created on."""
    from torch.distributed import PrefixStore

    return PrefixStore(f"{generation_keys.prefix(number)}pg/", root)


def replacing() -> bool:
    """Whether this process was started to fill a vacant place (``RANKGUARD_REPLACING``)."""
    return os.environ.get(REPLACING_ENV, "") not in ("", "0")


def replacements_started() -> bool:
    """Whether a launcher starts replacements for this job's failed ranks (``rankguard run
    --recovery in-place`` sets ``RANKGUARD_REPLACE_TIMEOUT``): without one, a member that did
    not join a generation is not replaced, and waiting for it again cannot succeed."""
    return bool(os.environ.get(JOIN_TIMEOUT_ENV))


def refusal() -> str | None:
    """The launcher's word, posted in this rank's ledger with its notice, that the failed ranks'
    places will not be filled, and why (``rank 1 will not be replaced: <why>``: the attempt
    ends); None while it has said none (or this rank has no ledger: no launcher of ours)."""
    ledger = current().ledger
    return ledger.refusal() if ledger is not None else None


def join_timeout() -> float:
    """Seconds a replacement may take to join (``RANKGUARD_REPLACE_TIMEOUT``, else
    ``JOIN_TIMEOUT_S``).

    Raises:
        UsageError: the variable is not a positive number of seconds.
    """
    value = os.environ.get(JOIN_TIMEOUT_ENV)
    return check_seconds(JOIN_TIMEOUT_ENV, value) if value else JOIN_TIMEOUT_S


def publish(client: Any, record: Vacancies, limit: Deadline) -> None:
    """Make ``record`` the lineage record unless a newer generation's is there; by ``limit``
    (then it gives up silently: the replacement cannot join, and the members' join names it)."""
    ours = sealed.seal(LINEAGE_KEY, record.text())
    found = client.compare_set(LINEAGE_KEY, "", ours)
    while found != ours.encode() and not limit.passed():
        present = Vacancies.parse(sealed.unseal(LINEAGE_KEY, found, report=False))
        if present is not None and present.generation >= record.generation:
            return
        found = client.compare_set(LINEAGE_KEY, found, ours)


def current_record(client: Any) -> Vacancies | None:
    """The authentic lineage record in the store, or None."""
    if not client.check([LINEAGE_KEY]):
        return None
    return Vacancies.parse(sealed.unseal(LINEAGE_KEY, client.get(LINEAGE_KEY)))


def join(client: Any, place: int, limit: Deadline) -> Vacancies:
    """Fill ``place`` in the newest generation where it is vacant; returns that generation once
    every member has arrived (the caller then creates the group on its keys).

    Raises:
        UsageError: no secret was given to this process (``RANKGUARD_SECRET``): it could not
            prove its arrival to the members.
        CollectiveTimeout: no generation with ``place`` vacant formed with it by ``limit``.
    """
    if not sealed.adopt_kept():
        raise UsageError("RANKGUARD_REPLACING", "a replacement rank needs the run's secret to "
                         "join its peers", "give every rank the same RANKGUARD_SECRET (rankguard "
                         "run does, or its ranks keep the one they agreed on in "
                         "RANKGUARD_SECRET_FILE)")
    started, tried = time.monotonic(), -1
    missing: list[int] = []
    late = False  # the members of the last generation tried had given up on this place
    while not limit.passed():
        record = current_record(client)
        # once this process arrived at a generation that did not form, the survivors count it
        # among the members of the next one (it was not missing), no longer as a vacancy
        usable = (record is not None and record.generation > tried
                  and (place in record.vacant or (tried >= 0 and place < record.size))
                  and record.until - time.time() > _ARRIVE_MARGIN_S
                  and not generation_keys.formed(client, record.generation))
        if not usable:
            time.sleep(limit.wait_time(_POLL_S))
            continue
        assert record is not None
        tried = record.generation
        # the members may decide that it failed before its time is up (a member was stopped)
        meeting = barrier.meet(client, generation_keys.join_barrier(record.generation), place,
                               record.size, limit.within(record.until - time.time()),
                               stop=_decided_failed(client, record.generation))
        # the members' decision, not this process's view: a member that gave up just as this
        # one arrived may have decided that the generation failed
        failed_for = generation_keys.decide(client, record.generation,
                                            None if meeting.complete else meeting.missing, limit)
        if failed_for is None:
            return record
        missing, late = generation_keys.others_missing(failed_for, place)
    why = " (the members of the last one tried gave up on this place before it arrived)" \
        if late else ""
    raise CollectiveTimeout(f"could not fill place {place}: no generation with it vacant "
                            f"formed in time{why}", op="join", seq=tried, group=WORLD, rank=place,
                            missing=missing, waited=time.monotonic() - started)


def _decided_failed(client: Any, number: int) -> Callable[[], bool]:
    """Whether a member decided that generation ``number`` failed (``generation_keys``)."""
    return lambda: generation_keys.failed_for(client, number) is not None
