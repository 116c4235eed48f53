"""Seeing another node go silent, without waiting for a collective to time out.

During a round, each agent publishes a **beat** to the job's store every ``period`` seconds (a
record under the round's agents' prefix whose sequence number grows) and, in the same exchange,
reads every node's beat with one ``multi_get``. A node whose beat stopped changing is gone
(its agent was killed with its ranks), frozen (its whole process tree stopped, its machine
wedged) or cut off (its network is down): :func:`silence` names it once its beat has been seen
unchanged for ``limit`` seconds, the launcher's ``--hang-timeout``.

The judgement rests only on evidence: a node is silent for as long as **two of our own
exchanges that completed** saw the same beat of it. An agent that was itself stopped or
starved for a while therefore never blames a node for its own gap: after it resumes, its first
exchange reads the fresh beats.

Beats are sealed with the job's secret when the nodes share one (``RANKGUARD_SECRET``, see
``sealed``): a value without the seal in a node's key is no sign of its life.

The exchange runs on a thread of its own, on a store client of its own: a store whose host is
stopped leaves that thread blocked in a request (torch's client has no bound on that, see
``store_calls``), never the agent's event loop. The agent reads only what the thread
recorded; a request that has been outstanding for ``limit`` seconds means the store is silent.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..records import beats
from ..store import sealed
from ..errors import first_line

# A gap this long (or half the limit) between two questions means the asking agent itself was
# stopped or starved: a store request outstanding across it is timed from the agent's return.
_OWN_GAP_S = 1.0


@dataclass(frozen=True)
class Silence:
    """A node (or the job's store, ``node`` None) that has not been heard for ``silent_s``."""

    node: int | None
    silent_s: float
    host: str = ""  # the silent node's host, as its last beat gave it

    def describe(self, store_name: str) -> str:
        """In words; ``store_name``: the store, as ``the job's store at HOST:PORT``."""
        if self.node is None:
            return (f"{store_name} has not answered for {self.silent_s:.1f} s "
                    "(its node froze, or the network to it is down)")
        where = f" (host {self.host})" if self.host else ""
        return (f"node {self.node}{where} has published no progress for {self.silent_s:.1f} s: "
                "its agent and ranks are gone, frozen, or cut off from the network")


@dataclass
class Heard:
    """What our exchanges saw of one node's beat (times are ours, monotonic)."""

    value: bytes | None
    since: float  # when an exchange first saw this value (completed)
    host: str = ""
    read_at: float = -math.inf  # when the latest exchange that read this value began
    # The node provably published after this instant: its current value differs from one that
    # an exchange begun then had read. A value first seen after an instant may have been
    # written before it; only a change across two reads proves a publication after the first.
    alive_after: float = -math.inf


def silence(heard: Mapping[int, Heard], last_exchange: float, pending_since: float | None,
            now: float, limit: float) -> Silence | None:
    """Who has been silent past ``limit`` seconds, from our exchanges' record. Pure.

    ``heard``: every other node of the round; ``last_exchange``: when our latest exchange
    completed; ``pending_since``: when the request in progress began (None: none is). The store
    comes first (while it does not answer, no node can be judged); else the node silent the
    longest, as long as the latest completed exchange still saw its old beat.
    """
    if pending_since is not None and now - pending_since >= limit:
        return Silence(None, now - pending_since)
    worst: Silence | None = None
    for node, seen in heard.items():
        silent_s = last_exchange - seen.since
        if silent_s >= limit and (worst is None or silent_s > worst.silent_s):
            worst = Silence(node, silent_s, seen.host)
    return worst


def quiet_since(heard: Mapping[int, Heard], since: float, last_exchange: float,
                evidence: float) -> Silence | None:
    """The node that has not provably published since ``since`` and whose beat our exchanges
    have seen unchanged for ``evidence`` seconds (a live node beats several times meanwhile);
    the one silent the longest. Pure. For a fault that suggests a node is gone (its ranks'
    connections broke): it is told long before a whole hang timeout."""
    quiet = [Silence(node, last_exchange - seen.since, seen.host)
             for node, seen in heard.items()
             if seen.alive_after < since and last_exchange - seen.since >= evidence]
    return max(quiet, key=lambda silent: silent.silent_s, default=None)


def all_alive_after(heard: Mapping[int, Heard], since: float) -> bool:
    """Whether every node has provably published after ``since``. Pure."""
    return all(seen.alive_after >= since for seen in heard.values())


class NodeBeats:
    """This node's beat in one round and what it hears of the others (see the module doc).

    Args:
        connect: makes a client of the job's store (one, for this object's thread).
        prefix: the round's agents' prefix (``store_keys.agents_namespace``).
        node, nodes: this node's rank among the round's nodes, and their number.
        period: seconds between exchanges.
        host: this node's name, carried in its beat.
        progress: this node's ranks' progress in the world group, ``[rank, entered, done,
            kind]`` each (kind: the ledger's code of the last operation entered), carried in
            its beat (read by the exchange's thread: it must not block).
        asynchronous, left: its ranks' asynchronous groups (``beats.beat_async``) and
            departures (``beats.beat_left``), carried the same way.
    """

    def __init__(self, connect: Callable[[], Any], prefix: str, node: int, nodes: int,
                 period: float, host: str,
                 progress: Callable[[], list[list[int]]] = list,
                 asynchronous: Callable[[], list[list[int]]] = list,
                 left: Callable[[], list[list[int]]] = list) -> None:
        self._connect = connect
        self._keys = [beats.key(prefix, n) for n in range(nodes)]
        self._node = node
        self._period = period
        self._host = host
        self._progress = progress
        self._asynchronous = asynchronous
        self._left = left
        started = time.monotonic()
        self._heard = {n: Heard(None, started) for n in range(nodes) if n != node}
        self._last_exchange = started
        self._pending_since: float | None = started  # connecting counts as a request
        self._looked: float | None = None  # when silence() was last asked
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.exchanges = 0  # completed, for tests and benchmarks
        self.problem = ""  # the last store error the thread met, for messages
        self._thread = threading.Thread(target=self._run, name="rankguard-node-beats",
                                        daemon=True)
        self._thread.start()

    def silence(self, now: float, limit: float, excluding: frozenset[int] = frozenset()
                ) -> Silence | None:
        """The node (or store) silent for ``limit`` seconds at ``now``, if any, but the nodes
        ``excluding`` (lost already, their place being taken)."""
        with self._lock:
            if (self._pending_since is not None and self._looked is not None
                    and now - self._looked > max(_OWN_GAP_S, limit / 2)):
                self._pending_since = now  # we were stopped ourselves: not the store's time
            self._looked = now
            heard = {node: seen for node, seen in self._heard.items() if node not in excluding}
            return silence(heard, self._last_exchange, self._pending_since, now, limit)

    def beating_since(self, node: int, since: float) -> str | None:
        """The host of ``node``'s beat if an exchange first saw its current beat after
        ``since`` (monotonic), else None."""
        with self._lock:
            seen = self._heard.get(node)
            return seen.host if seen is not None and seen.since > since else None

    def quiet_since(self, since: float, evidence: float) -> Silence | None:
        """See :func:`quiet_since`."""
        with self._lock:
            return quiet_since(self._heard, since, self._last_exchange, evidence)

    def all_alive_after(self, since: float) -> bool:
        """See :func:`all_alive_after`."""
        with self._lock:
            return all_alive_after(self._heard, since)

    def heard(self) -> dict[int, tuple[bytes, float]]:
        """Each other node's latest beat, and when an exchange first saw it (nodes not heard
        yet are left out)."""
        with self._lock:
            return {node: (seen.value, seen.since) for node, seen in self._heard.items()
                    if seen.value is not None}

    def close(self) -> None:
        """Stop beating (the thread ends after its request in progress, if any)."""
        self._closed.set()

    def _run(self) -> None:
        try:
            client = self._connect()
            self._done_request()
            sequence = 0
            while not self._closed.wait(self._period):
                sequence += 1
                self._exchange(client, sequence)
        except RuntimeError as exc:  # the store failed: its host is gone (round_end says so)
            self.problem = first_line(exc)

    def _exchange(self, client: Any, sequence: int) -> None:
        with self._lock:
            self._pending_since = began = time.monotonic()
        mine = self._keys[self._node]
        client.set(mine, sealed.seal(mine, beats.encode(sequence, self._host, self._progress(),
                                                        self._asynchronous(), self._left())))
        others = [n for n in self._heard]
        if client.check([self._keys[n] for n in others]):
            values = dict(zip(others, client.multi_get([self._keys[n] for n in others])))
        else:  # the first beats of a round: read those that exist
            values = {n: client.get(self._keys[n]) for n in others
                      if client.check([self._keys[n]])}
        opened = {}
        for node, value in values.items():
            payload = sealed.unseal(self._keys[node], value)
            if payload is not None:  # a beat without the job's seal is no sign of life
                opened[node] = payload.encode()
        now = time.monotonic()
        with self._lock:
            for node, value in opened.items():
                seen = self._heard[node]
                if value != seen.value:
                    seen.alive_after = seen.read_at
                    seen.value, seen.since, seen.host = value, now, beats.host_of(value)
                seen.read_at = began
            self._last_exchange = now
            self._pending_since = None
            self.exchanges += 1

    def _done_request(self) -> None:
        with self._lock:
            self._pending_since = None
            self._last_exchange = time.monotonic()
