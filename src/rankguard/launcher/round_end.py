"""How a rendezvous round ends on every node: one record in the job's store.

Each agent watches its own ranks as on one node. What it cannot see is another node's ranks,
so each round has one **end** key (under ``store_keys.agents_namespace``), written once:

- by the first agent that sees a fault among its ranks (or is told to stop): a
  :class:`RoundEnd` naming the node, the rank, the kind of fault and what happened. Written
  with ``compare_set`` so the first one stands; one exception: a fault that may be a cascade (an
  error inside a collective, what a peer's death does to its peers) gives way to a fault that is
  not (:func:`replaces`), so the root cause is named on every node;
- by the last agent whose ranks all ended well (a counter of the nodes done): ``ok``.

Every value is sealed with the job's secret when the nodes share one (``RANKGUARD_SECRET``, see
``sealed``): an end without the seal ends the round as a fault that names it, never as the
fault it claims.

The agent's own requests (publishing, counting its node done) are bounded by the store's
``read_timeout`` whatever state the store's server is in (``store_calls``): a frozen store's
host makes them raise ``StoreStalled``, a RuntimeError, as a failed store does.

Every agent learns of the end at once, from a watcher thread blocked in the store's own ``wait``
for that key (on a client of its own, so the agent's store requests never queue behind it),
which then pokes the agent's event loop. The watcher's waits are slices of ``WATCH_SLICE_S``
(the store answers the moment the key is written; a slice only bounds each request); a watcher
whose store connection fails reports the store as lost: the job cannot go on without it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Callable

from ..store import sealed
from ..deadline import Deadline
from ..store.store_calls import within
from ..records.ledger_ring import wall_offset
from .monitor import Verdict
from .outcome import Fault, FaultKind

WATCH_SLICE_S = 3600.0


@dataclass(frozen=True)
class RoundEnd:
    """How a round ended: ``ok``, or the fault that ended it, as the store holds it."""

    ok: bool
    node: int = -1  # the node rank of the agent that ended it
    kind: str = ""  # a FaultKind's value ("" when ok)
    rank: int | None = None  # the global rank at fault, if one is
    detail: str = ""
    cascade: bool = False
    # when the fault happened, in wall-clock seconds (the one clock the nodes share; 0: unknown)
    at_wall: float = 0.0
    hang: dict[str, Any] | None = None  # a hang: its verdict (``Verdict.record``)

    @classmethod
    def of(cls, fault: Fault, node: int) -> RoundEnd:
        """The record of this node's ``fault``; a stop of this agent is ``node_left``."""
        at_wall = round(fault.at + wall_offset(), 6)
        if fault.kind == FaultKind.LAUNCHER_SIGNAL:  # "the launcher received SIGTERM"
            return cls(False, node, FaultKind.NODE_LEFT, None,
                       fault.detail.replace("the launcher", "the agent"), at_wall=at_wall)
        return cls(False, node, fault.kind, fault.rank, fault.detail, fault.cascade, at_wall,
                   fault.verdict.record() if fault.verdict is not None else None)

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, value: bytes | str) -> RoundEnd:
        """The record in ``value``; a value that is not one (written by something else) ends
        the round as a fault that says so."""
        try:
            fields = json.loads(value)
            end = cls(**fields)
            if not isinstance(end.at_wall, (int, float)) or not (
                    end.hang is None or isinstance(end.hang, dict)):
                raise TypeError("at_wall or hang")
            if not end.ok:
                FaultKind(end.kind)  # ValueError: not a kind of this rankguard
            return end
        except (ValueError, TypeError):
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            return cls(False, -1, FaultKind.STORE_LOST, None,
                       f"the round's end key holds {text[:80]!r}, "
                       "not a record of rankguard's")

    def fault(self, now: float) -> Fault:
        """The fault as another node acts on it at ``now`` (its kind gives the exit code): at
        the moment it happened there, on this machine's monotonic clock (``now`` if unknown,
        never later), with the hang's verdict."""
        # a node_lost record names the lost node in its text; its node is the one that saw it
        where = f" (node {self.node})" if self.node >= 0 and self.kind != FaultKind.NODE_LOST else ""
        at = min(now, self.at_wall - wall_offset()) if self.at_wall > 0 else now
        verdict = Verdict.from_record(self.hang) if self.hang is not None else None
        return Fault(FaultKind(self.kind), at, self.rank, f"{self.detail}{where}", self.cascade,
                     verdict)

    def describe(self) -> str:
        return "ok" if self.ok else self.fault(0.0).describe()


def replaces(standing: RoundEnd, ours: RoundEnd) -> bool:
    """Whether ``ours`` takes the place of the ``standing`` record: only a fault that is not a
    cascade over one that is. Pure."""
    return not standing.ok and standing.cascade and not ours.ok and not ours.cascade


def end_key(prefix: str) -> str:
    """The key of the round's end under the round's agents' prefix (present once it ended)."""
    return prefix + "end"


class RoundChannel:
    """The end of one round, for one agent: publish it, learn it, wait for it.

    Args:
        store: the agent's client of the job's store (its requests are short).
        connect: makes another client of the job's store, for the watcher.
        prefix: the round's agents' prefix (``store_keys.agents_namespace``).
        nodes: how many nodes the round has.
        store_name: the store, for messages (``the job's store at HOST:PORT``).
        wake: called (from the watcher's thread) when the end is known.
        request_s: the most one of the agent's requests may take.
    """

    def __init__(self, store: Any, connect: Callable[[], Any], prefix: str, nodes: int,
                 store_name: str, wake: Callable[[], None], request_s: float) -> None:
        self._store_name = store_name
        self._store = store
        self._request_s = request_s
        self._connect = connect
        self._key = end_key(prefix)
        self._done_key = prefix + "done"
        self._nodes = nodes
        self._wake = wake
        self._ended = threading.Event()
        self._end: RoundEnd | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._watch, name="rankguard-round-end",
                                        daemon=True)
        self._thread.start()

    @property
    def end(self) -> RoundEnd | None:
        """The round's end once known, else None."""
        return self._end

    def publish(self, ours: RoundEnd) -> RoundEnd:
        """End the round with ``ours`` unless it has ended already; returns the record that
        stands (``ours``, or the earlier one).

        Raises:
            RuntimeError: the store failed, or did not answer within ``request_s`` (then
                ``StoreStalled``: the agent's client must not be used again).
        """
        value = sealed.seal(self._key, ours.encode())
        standing = self._request("ending the round", lambda: self._store.compare_set(
            self._key, "", value))
        if standing != value.encode():
            earlier = self._open(standing)
            if not replaces(earlier, ours):
                self._learn(earlier)
                return earlier
            self._request("ending the round", lambda: self._store.compare_set(
                self._key, standing, value))
        self._learn(ours)
        return ours

    def done(self) -> None:
        """This node's ranks all ended well: count it; the last node to do so ends the round
        ``ok``. Raises as :meth:`publish` does."""
        counted = self._request("counting this node done", lambda: self._store.add(
            self._done_key, 1))
        if counted >= self._nodes:
            self.publish(RoundEnd(True))

    def _open(self, value: bytes) -> RoundEnd:
        """The record in the end key's ``value``; one without this job's seal (see
        ``sealed``) ends the round as a fault that says so."""
        payload = sealed.unseal(self._key, value)
        if payload is None:
            return RoundEnd(False, -1, FaultKind.STORE_LOST, None, "the round's end key holds a value "
                            "without this job's seal: another process writes to the job's "
                            "store, or the nodes do not share RANKGUARD_SECRET")
        return RoundEnd.decode(payload)

    def _request(self, what: str, call: Callable[[], Any]) -> Any:
        return within(Deadline.after(self._request_s), f"{what} in {self._store_name}", call)

    def wait(self, until: Deadline) -> RoundEnd | None:
        """The round's end, waiting for it until ``until`` (or :meth:`interrupt`)."""
        self._ended.wait(until.wait_time_or_none())
        return self._end

    def interrupt(self) -> None:
        """Wake :meth:`wait` now (the agent received a signal)."""
        self._ended.set()

    def close(self) -> None:
        """Stop watching (the watcher ends within one slice; it holds nothing)."""
        self._closed = True

    def _learn(self, end: RoundEnd) -> None:
        if self._end is None:
            self._end = end
        self._ended.set()
        self._wake()

    def _watch(self) -> None:
        from torch.distributed import DistStoreError

        try:
            client = self._connect()
            while not self._closed and self._end is None:
                try:
                    client.wait([self._key], timedelta(seconds=WATCH_SLICE_S))
                except DistStoreError:  # the slice passed; a lost connection raises otherwise
                    continue
                self._learn(self._open(client.get(self._key)))
        except RuntimeError as exc:  # the store's connection failed: its host is gone
            if not self._closed and self._end is None:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                self._learn(RoundEnd(False, -1, FaultKind.STORE_LOST, None, f"lost {self._store_name} "
                                     f"(its node's agent is gone?): {first}"))
