"""The store barrier (``runtime.barrier``) on real torch stores, ranks played by threads: the
ranks are released by the last arrival, not before and not by a timer; at the deadline the
ranks that did not come are named on every rank that did; values that another client of the
store writes (arrivals, a release, the counter) neither release nor complete it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator

import pytest
import torch.distributed as dist

from rankguard.store import sealed
from rankguard.deadline import Deadline
from rankguard.runtime import barrier

SECRET = "5a" * 32
NAME = "rankguard/test/barrier"
LONG_S = 60.0  # a deadline no test here should reach: waiting for it would fail the test
SHORT_S = 1.5  # a deadline a test waits out, to see who is named missing (the ranks that
# come must have arrived by then: a thread may take 0.3 s to start on a loaded 2-core machine)
# what a rank may take past its deadline: the store operations that name the missing ranks
AFTER_DEADLINE_S = 4 * barrier.STORE_OP_MIN_S


@pytest.fixture(autouse=True)
def run_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sealed.ENV, SECRET)
    monkeypatch.delenv(sealed.NAMESPACE_ENV, raising=False)


@pytest.fixture(params=["HashStore", "TCPStore"])
def clients(request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    """A maker of clients of one fresh store: each rank (and an outsider) gets its own."""
    if request.param == "HashStore":
        store = dist.HashStore()
        yield lambda: store
        return
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=LONG_S))
    yield lambda: dist.TCPStore("127.0.0.1", server.port, is_master=False,
                                timeout=timedelta(seconds=LONG_S))


@dataclass
class Arrival:
    meeting: barrier.Meeting | None = None
    returned_at: float = 0.0
    error: BaseException | None = None


class Ranks:
    """Ranks of one barrier, each in a thread with its own client."""

    def __init__(self, clients: Callable[[], Any], size: int, limit: Deadline) -> None:
        self.clients, self.size, self.limit = clients, size, limit
        self.threads: dict[int, threading.Thread] = {}
        self.arrivals: dict[int, Arrival] = {}

    def arrive(self, *ranks: int) -> None:
        for rank in ranks:
            arrival = self.arrivals[rank] = Arrival()
            client = self.clients()

            def run(rank: int = rank, arrival: Arrival = arrival, client: Any = client) -> None:
                try:
                    arrival.meeting = barrier.meet(client, NAME, rank, self.size, self.limit,
                                                   payload=f"payload of {rank}")
                except BaseException as error:  # noqa: BLE001 (reported by results())
                    arrival.error = error
                arrival.returned_at = time.monotonic()

            self.threads[rank] = threading.Thread(target=run, daemon=True)
            self.threads[rank].start()

    def arrived(self, *ranks: int) -> None:
        """Return once ``ranks`` wrote their arrival (they then wait for the release)."""
        self.clients().wait([barrier.arrival_key(NAME, r) for r in ranks],
                            timedelta(seconds=self.limit.wait_time()))

    def results(self) -> dict[int, Arrival]:
        for rank, thread in self.threads.items():
            thread.join(self.limit.wait_time() + AFTER_DEADLINE_S)
            assert not thread.is_alive(), f"rank {rank} is still in the barrier"
            assert self.arrivals[rank].error is None, self.arrivals[rank].error
        return self.arrivals


@pytest.mark.parametrize("size", [1, 2, 4])
def test_every_rank_is_released_by_the_last_arrival_with_every_payload(
        clients: Callable[[], Any], size: int) -> None:
    ranks = Ranks(clients, size, Deadline.after(LONG_S))
    ranks.arrive(*range(size - 1))
    ranks.arrived(*range(size - 1))
    last_arrival = time.monotonic()
    ranks.arrive(size - 1)
    for rank, arrival in ranks.results().items():
        assert arrival.meeting is not None and arrival.meeting.complete, (rank, arrival)
        assert arrival.meeting.arrived == {r: f"payload of {r}" for r in range(size)}
        assert last_arrival <= arrival.returned_at < ranks.limit.at, (rank, arrival)


@pytest.mark.parametrize(("size", "absent"), [(2, [1]), (3, [0, 2]), (4, [3]), (5, [1, 2, 3])])
def test_at_the_deadline_every_rank_that_came_names_the_ones_that_did_not(
        clients: Callable[[], Any], size: int, absent: list[int]) -> None:
    ranks = Ranks(clients, size, Deadline.after(SHORT_S))
    ranks.arrive(*(r for r in range(size) if r not in absent))
    for rank, arrival in ranks.results().items():
        assert arrival.meeting is not None and arrival.meeting.missing == absent, (rank, arrival)
        assert not arrival.meeting.complete
        assert ranks.limit.at <= arrival.returned_at < ranks.limit.at + AFTER_DEADLINE_S


def test_every_value_a_rank_acts_on_is_sealed_for_its_key(clients: Callable[[], Any]) -> None:
    ranks = Ranks(clients, 2, Deadline.after(LONG_S))
    ranks.arrive(0, 1)
    ranks.results()
    outsider = clients()
    for rank in (0, 1):
        key = barrier.arrival_key(NAME, rank)
        assert sealed.unseal(key, outsider.get(key)) == f"payload of {rank}"
    assert sealed.unseal(f"{NAME}/released", outsider.get(f"{NAME}/released")) == "released"


def _forge_arrival_of_1(client: Any) -> None:
    client.set(barrier.arrival_key(NAME, 1), "-.arrived")  # unsealed, as any client can
    client.add(f"{NAME}/count", 1)


def _forge_release(client: Any) -> None:
    client.set(f"{NAME}/released", sealed.seal(f"{NAME}/elsewhere", "released"))  # moved


def _forge_count(client: Any) -> None:
    client.add(f"{NAME}/count", 3)


FORGERIES = {
    # (what another client writes before the ranks come, the ranks that come)
    "an arrival for the absent rank": (_forge_arrival_of_1, [0, 2]),
    "a release before anyone came": (_forge_release, [0, 1, 2]),
    "a count that says everyone came": (_forge_count, [0, 1, 2]),
}


@pytest.mark.parametrize(("forge", "coming"), FORGERIES.values(), ids=FORGERIES.keys())
def test_values_another_client_writes_neither_release_nor_complete_the_barrier(
        clients: Callable[[], Any], forge: Callable[[Any], None], coming: list[int]) -> None:
    complete = coming == [0, 1, 2]
    ranks = Ranks(clients, 3, Deadline.after(LONG_S if complete else SHORT_S))
    forge(clients())
    dropped = sealed.dropped()
    ranks.arrive(*coming[:-1])
    ranks.arrived(*coming[:-1])
    last_arrival = time.monotonic()
    ranks.arrive(coming[-1])
    for rank, arrival in ranks.results().items():
        assert arrival.meeting is not None, (rank, arrival)
        if complete:  # released by the last genuine arrival, not by the forgery
            assert arrival.meeting.complete, (rank, arrival)
            assert last_arrival <= arrival.returned_at < ranks.limit.at, (rank, arrival)
        else:  # the forged arrival was read and not believed
            assert arrival.meeting.missing == [1], (rank, arrival)
            assert arrival.returned_at >= ranks.limit.at, (rank, arrival)
    if forge is not _forge_count:
        assert sealed.dropped() > dropped  # the forged value was read, and dropped


@pytest.mark.parametrize("first", ["the one that arrives", "the ones that meet"])
def test_a_rank_that_only_arrives_completes_the_meeting_with_its_payload_and_returns_at_once(
        clients: Callable[[], Any], first: str) -> None:
    ranks = Ranks(clients, 3, Deadline.after(LONG_S))
    if first == "the ones that meet":
        ranks.arrive(0, 1)
        ranks.arrived(0, 1)
    client = clients()  # connecting is not part of arriving: it may take seconds under load
    started = time.monotonic()
    barrier.arrive(client, NAME, 2, 3, Deadline.after(LONG_S), payload="at the end")
    assert time.monotonic() - started < AFTER_DEADLINE_S  # it did not wait for the others
    if first == "the one that arrives":
        ranks.arrive(0, 1)
    for rank, arrival in ranks.results().items():
        assert arrival.meeting is not None and arrival.meeting.complete, (rank, arrival)
        assert arrival.meeting.arrived[2] == "at the end"
        assert arrival.returned_at < ranks.limit.at - LONG_S / 2  # released, not timed out


def test_a_rank_told_that_the_missing_will_not_come_stops_waiting_at_once_naming_them(
        clients: Callable[[], Any]) -> None:
    """``stop`` (the launcher's refusal to start a replacement) ends the wait within a slice of
    its becoming true, long before the deadline; the meeting names who did not come."""
    told = threading.Event()
    outcome: dict[str, Any] = {}
    client = clients()

    def wait() -> None:
        outcome["meeting"] = barrier.meet(client, NAME, 0, 2, Deadline.after(LONG_S),
                                          stop=told.is_set)
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    clients().wait([barrier.arrival_key(NAME, 0)], timedelta(seconds=LONG_S))
    told_at = time.monotonic()
    told.set()
    thread.join(LONG_S)
    assert not thread.is_alive()
    assert outcome["meeting"].missing == [1] and not outcome["meeting"].complete
    assert outcome["at"] - told_at < barrier.STOP_POLL_S + AFTER_DEADLINE_S
