"""The job's store before any process group exists: a store barrier in the store a launcher hosts.

``torchrun`` and ``rankguard run`` host the job's store themselves and tell the ranks so
(``TORCHELASTIC_USE_AGENT_STORE=True``, its address in ``MASTER_ADDR``/``MASTER_PORT``):
a rank can reach it before its ``init_process_group``, as a client, without hosting anything.
``rankguard run`` gives each attempt a key prefix (``RANKGUARD_NAMESPACE``), used here too.
Where no launcher hosts it (rank 0 hosts it inside its ``init_process_group``), there is no
store to meet in yet, and :func:`meet` says so (None).

The arrivals are sealed as every barrier's (``runtime.barrier``): with the run's secret where
the host gave one (``rankguard run`` on one node); before the default group forms elsewhere
(``torchrun``), no secret exists yet and they are not authenticated (see ``store.sealed``).

Bounds: the connection and every store call run on a helper thread joined until the deadline
(``store_calls.within``), plus ``ALLOWANCE_S`` for the last reads of who arrived.
"""

from __future__ import annotations

import os
from datetime import timedelta

from ..deadline import Deadline
from ..store.store_calls import within
from . import barrier, store_reachable

ALLOWANCE_S = 0.5  # a barrier's last reads, after the deadline, of who arrived


def address() -> tuple[str, int] | None:
    """Where the launcher hosts the job's store, or None (none does: rank 0 will)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return store_reachable.address("env://")


def meet(name: str, limit: Deadline, payload: str) -> barrier.Meeting | None:
    """Every rank of the job (``RANK`` of ``WORLD_SIZE``) meets at the store barrier ``name``
    in the launcher's store, bringing ``payload``; None where no launcher hosts the store.
    Returns by ``limit`` plus ``ALLOWANCE_S``, whatever state the store is in.

    Raises:
        RuntimeError: torch's, when the store cannot be reached or fails; ``StoreStalled``
            (a RuntimeError) when it does not answer in time.
    """
    where = address()
    if where is None:
        return None
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    namespace = os.environ.get("RANKGUARD_NAMESPACE", "")

    def calls() -> barrier.Meeting:
        from torch.distributed import PrefixStore, TCPStore

        timeout = timedelta(seconds=limit.wait_time(at_least=barrier.STORE_OP_MIN_S))
        client = TCPStore(where[0], where[1], is_master=False, timeout=timeout,
                          wait_for_workers=False)
        store = PrefixStore(namespace, client) if namespace else client
        return barrier.meet(store, name, rank, size, limit, payload)

    return within(limit.later(ALLOWANCE_S), f"the barrier {name}", calls)
