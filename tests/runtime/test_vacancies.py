"""The lineage record that tells a replacement where to join, on a real TCPStore: only a newer
generation's record replaces one, a forged one is ignored and overwritten, and a replacement that
finds no usable generation gives up at its deadline with an error naming its place."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Iterator

import pytest

from rankguard import CollectiveTimeout, UsageError
from rankguard.store import sealed
from rankguard.deadline import Deadline
from rankguard.runtime import barrier, generation_keys, vacancies
from rankguard.runtime.vacancies import LINEAGE_KEY, Vacancies

from .ranks import free_port


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from torch.distributed import TCPStore

    monkeypatch.setenv(sealed.ENV, "5e" * 32)
    yield TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False,
                   timeout=timedelta(seconds=10))


def _record(generation: int, vacant: tuple[int, ...] = (2,), until_s: float = 30.0) -> Vacancies:
    return Vacancies(generation, 4, vacant, time.time() + until_s)


def test_only_a_newer_generation_replaces_the_record(store: Any) -> None:
    limit = Deadline.after(5)
    vacancies.publish(store, _record(2), limit)
    vacancies.publish(store, _record(1, (0,)), limit)  # a slow survivor of an older one
    assert vacancies.current_record(store).generation == 2
    vacancies.publish(store, _record(3, (1,)), limit)
    record = vacancies.current_record(store)
    assert (record.generation, record.vacant) == (3, (1,))


def test_a_forged_record_is_ignored_and_replaced(store: Any) -> None:
    store.set(LINEAGE_KEY, "0" * 64 + "." + _record(99, (0, 1, 2, 3)).text())
    assert vacancies.current_record(store) is None
    vacancies.publish(store, _record(1), Deadline.after(5))
    assert vacancies.current_record(store).generation == 1


@pytest.mark.parametrize("record", [None, "stale", "other_place", "formed"])
def test_a_replacement_without_a_usable_generation_gives_up_at_its_deadline(
        store: Any, record: str | None) -> None:
    if record == "stale":  # its members stopped waiting already
        vacancies.publish(store, _record(1, until_s=-1), Deadline.after(5))
    elif record == "other_place":
        vacancies.publish(store, _record(1, (3,)), Deadline.after(5))
    elif record == "formed":  # an earlier replacement filled the place, and the place failed
        # again before the survivors published the next generation
        vacancies.publish(store, _record(1), Deadline.after(5))
        for place in range(4):
            barrier.arrive(store, generation_keys.join_barrier(1), place, 4, Deadline.after(5))
    started = time.monotonic()
    with pytest.raises(CollectiveTimeout, match="could not fill place 2") as error:
        vacancies.join(store, 2, Deadline.after(0.5))
    assert 0.4 < time.monotonic() - started < 5
    assert error.value.rank == 2 and error.value.op == "join"


def test_a_replacement_without_the_runs_secret_is_told_how_to_give_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sealed.ENV, raising=False)
    monkeypatch.setattr(sealed, "key", lambda: None)
    with pytest.raises(UsageError, match="RANKGUARD_SECRET"):
        vacancies.join(object(), 1, Deadline.after(1))


@pytest.mark.parametrize("text", ["", "{}", "[1]", '{"generation": "x", "size": 4, '
                                  '"vacant": [1], "until": 0}', "not json"])
def test_a_malformed_record_is_no_record(text: str) -> None:
    assert Vacancies.parse(text) is None


@pytest.mark.parametrize("decided", ["failed", "undecided"])
def test_a_replacement_acts_on_the_members_decision_not_on_its_own_view_of_the_barrier(
        store: Any, decided: str) -> None:
    """The replacement arrives last, so it sees every member at the join barrier; but when a
    member gave up just before (and decided that the generation failed for want of place 2),
    the replacement must not create a group its peers abandoned."""
    vacancies.publish(store, _record(1), Deadline.after(5))
    for place in (0, 1, 3):
        barrier.arrive(store, generation_keys.join_barrier(1), place, 4, Deadline.after(5))
    if decided == "failed":
        assert generation_keys.decide(store, 1, [2], Deadline.after(5)) == [2]
        with pytest.raises(CollectiveTimeout, match="could not fill place 2") as error:
            vacancies.join(store, 2, Deadline.after(1))
        # the place itself is not named as the one that did not arrive: it did, too late
        assert error.value.missing == []
        assert "gave up on this place before it arrived" in str(error.value)
        return
    assert vacancies.join(store, 2, Deadline.after(5)).generation == 1
    assert generation_keys.failed_for(store, 1) is None  # decided: formed
    assert generation_keys.decide(store, 1, [0], Deadline.after(5)) is None  # decided once
