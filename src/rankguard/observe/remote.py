"""The other nodes' ranks of a multi-node run, for ``rankguard status`` on one of its nodes: read
from the beats their agents publish in the round's store (``beats``), as the agents hear each
other.

The round's store and prefix come from this node's journal (its latest ``rendezvous`` event).
The beats are sealed with the job's secret (``sealed``): it is taken from ``RANKGUARD_SECRET``,
else from this node's agent's environment (readable by its own user only); a beat that does not
open with it is not shown. Every store call is bounded (``store_calls``): a store that does not
answer costs ``READ_S``, and is said.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..records import beats
from ..store import sealed, store_calls
from ..deadline import Deadline
from ..errors import first_line
from ..records.ledger import op_name

READ_S = 3.0  # the most a read of the other nodes' beats waits for the round's store
MAX_NODES = 4096  # more than a journal's beats field may name


@dataclass(frozen=True)
class RemoteRank:
    """A rank of another node, as its node's latest beat gives it (its world group)."""

    rank: int
    node: int
    host: str
    entered: int
    done: int
    kind: str


@dataclass(frozen=True)
class Nodes:
    """What was read of the other nodes: their ranks, and why some could not be, if so."""

    store: str  # the round's store, HOST:PORT
    ranks: tuple[RemoteRank, ...]
    problem: str | None = None


def read(events: list[dict[str, Any]], limit: float = READ_S) -> Nodes | None:
    """The other nodes' ranks in the run's latest round; None for a run on one node."""
    joined = [e for e in events if e["event"] == "rendezvous" and isinstance(e.get("beats"), dict)]
    if not joined:
        return None
    info, me = joined[-1]["beats"], joined[-1].get("group_rank")
    store, prefix, count = str(info.get("store", ""))[:300], str(info.get("prefix", ""))[:300], \
        info.get("nodes")
    try:
        host, port = _address(store)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= MAX_NODES:
            raise ValueError(count)
    except ValueError:
        return Nodes(store, (), "the journal's beats field is not one of ours")
    nodes = [n for n in range(count) if n != me]
    keys = {beats.key(prefix, node): node for node in nodes}
    from torch.distributed import TCPStore  # imported before the bound: it takes seconds

    try:
        values = store_calls.within(Deadline.after(limit), "reading the other nodes' beats",
                                    lambda: _fetch(TCPStore, host, port, list(keys), limit))
    except Exception as exc:  # noqa: BLE001 (torch's client raises several kinds)
        return Nodes(store, (), f"the round's store at {store} did not answer: {first_line(exc)}")
    _use_job_secret(events)
    found, unopened = [], []
    for key, node in keys.items():
        value = values.get(key)
        if value is None:
            continue
        payload = sealed.unseal(key, value, report=False)
        if payload is None:
            unopened.append(node)
            continue
        beat = payload.encode()
        host = beats.host_of(beat)
        found.extend(RemoteRank(entry[0], node, host, entry[1], entry[2], op_name(entry[3]))
                     for entry in beats.decode_ranks(beat))
    problem = None
    if unopened:
        problem = (f"the beats of node(s) {','.join(map(str, unopened))} do not carry this "
                   f"job's seal: set {sealed.ENV} as the job has it")
    missing = [node for key, node in keys.items() if key not in values]
    if missing:
        problem = (problem + "; " if problem else "") + \
            f"node(s) {','.join(map(str, missing))} published no beat in this round yet"
    return Nodes(store, tuple(sorted(found, key=lambda r: r.rank)), problem)


def _address(store: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` as (host, port).

    Raises:
        ValueError: it is neither, or the port is out of range.
    """
    host, _, port = store.rpartition(":")
    if not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(store)
    return host.strip("[]"), int(port)


def _fetch(store_class: Any, host: str, port: int, keys: list[str], limit: float
           ) -> dict[str, bytes]:
    client = store_class(host, port, is_master=False, timeout=timedelta(seconds=limit),
                      wait_for_workers=False)
    present = [key for key in keys if client.check([key])]
    return dict(zip(present, client.multi_get(present))) if present else {}


def _use_job_secret(events: list[dict[str, Any]]) -> None:
    """Open beats with the job's secret: ``RANKGUARD_SECRET`` if set, else this node's agent's
    (its pid from the journal's ``run_start``; its environment is readable by its user only)."""
    if os.environ.get(sealed.ENV):
        return
    start = next((e for e in events if e["event"] == "run_start"), {})
    try:
        with open(f"/proc/{int(start['pid'])}/environ", "rb") as environ:
            variables = dict(item.split(b"=", 1) for item in environ.read().split(b"\0")
                             if b"=" in item)
    except (KeyError, TypeError, ValueError, OSError):
        return
    secret = variables.get(sealed.ENV.encode())
    if secret:
        os.environ[sealed.ENV] = secret.decode(errors="replace")
