"""A standby node takes the place of a lost node inside the job (``--recovery in-place`` on
several nodes), instead of a restart.

The records live under the running round's agents' prefix of the job's store
(``store_keys.agents_namespace``), sealed with the job's secret: the nodes must share one
(``RANKGUARD_SECRET`` set alike on every node), for the standby's ranks join the survivors'
generation with it, and a standby must not act on a request anybody could write.

1. **A standby waits.** An agent that comes while a round runs (and this mode and the secret
   allow it) does not enter torch's rendezvous, which would only admit it to the next round:
   it counts itself among the round's standbys (:func:`stand_by`) and polls for a request
   (:func:`take`) until the round ends (then it joins the next round as usual) or the job does.
2. **A node is lost.** The first surviving agent to find a node silent (its beats) asks for
   its place to be taken (:func:`ask`) when a standby waits; every survivor then gives the
   standby a bounded time (``margins.replacement_limit``) to beat as that node, instead of
   ending the round. Their ranks, released by a notice, regroup keeping the lost ranks'
   places vacant.
3. **The standby takes it.** The first standby to claim the request becomes that node of the
   running round: its ranks start as replacements (``RANKGUARD_REPLACING=1``) of the lost
   node's ranks, join the survivors' generation and receive the state from a peer.

Pure records and store calls; the agents (``node_agent``) decide when.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..store import sealed

_STANDBYS = "standbys"  # how many standbys wait for this round's requests (a hint, unsealed)
_ASKED = "takeovers"  # how many requests were written, numbered from 0


@dataclass(frozen=True)
class Takeover:
    """A request that a standby become node ``node`` of round ``number``."""

    number: int  # the round, job-wide
    node: int  # the lost node's rank among the round's nodes
    nodes: int  # how many nodes the round has
    base: int  # the global rank of the lost node's local rank 0
    world: int  # ranks of every node
    store_host: str  # the round's store (the ranks' MASTER_ADDR)
    store_port: int
    cause: str  # why the node is lost, in words
    lost_at: float  # wall clock: when it was last heard

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> "Takeover":
        """Raises ValueError: not a request of ours."""
        try:
            fields = json.loads(text)
            return cls(int(fields["number"]), int(fields["node"]), int(fields["nodes"]),
                       int(fields["base"]), int(fields["world"]), str(fields["store_host"]),
                       int(fields["store_port"]), str(fields["cause"]),
                       float(fields["lost_at"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a takeover request: {exc}") from None


def possible() -> bool:
    """Whether this agent's nodes share a secret (the condition for a takeover)."""
    return sealed.from_host()


def stand_by(store: Any, prefix: str) -> None:
    """Count this agent among the round's waiting standbys."""
    store.add(prefix + _STANDBYS, 1)


def standbys(store: Any, prefix: str) -> int:
    """How many standbys have come to wait for the round's requests (some may have left)."""
    return store.add(prefix + _STANDBYS, 0)


def ask(store: Any, prefix: str, request: Takeover) -> bool:
    """Ask the round's standbys to take node ``request.node``'s place, unless another survivor
    has; returns whether this agent asked."""
    if store.add(f"{prefix}asked{request.node}", 1) != 1:
        return False
    index = store.add(prefix + _ASKED, 1) - 1
    key = f"{prefix}takeover.{index}"
    store.set(key, sealed.seal(key, request.encode()))
    return True


def take(store: Any, prefix: str, seen: int, nproc: int) -> tuple[Takeover | None, int]:
    """The first request from number ``seen`` on that this standby (of ``nproc`` ranks: the
    lost node's count) claims before any other (None: none yet), and the number of requests
    looked at so far."""
    asked = store.add(prefix + _ASKED, 0)
    for index in range(seen, asked):
        key = f"{prefix}takeover.{index}"
        if not store.check([key]):
            return None, index  # counted, not written yet: look again next time
        payload = sealed.unseal(key, store.get(key))
        if payload is None:
            continue  # not sealed with the job's secret: never acted on
        try:
            request = Takeover.decode(payload)
        except ValueError:
            continue
        if request.world != request.nodes * nproc:
            continue  # the nodes have other counts of ranks: not a place this node fits
        if store.add(f"{key}.claimed", 1) == 1:
            return request, index + 1
    return None, asked


def since_lost(request: Takeover) -> float:
    """Seconds from the lost node's last beat to now (wall clock: another node's)."""
    return max(0.0, time.time() - request.lost_at)
