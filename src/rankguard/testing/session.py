"""Suites that every rank of a job runs (Megatron style: ``torchrun ... -m pytest``).

Under a launcher (``RANK``, ``WORLD_SIZE`` > 1, ``MASTER_ADDR`` and ``MASTER_PORT`` set), the
plugin turns on the rank runtime at configure time (``rankguard.init``: SIGTERM teardown,
stacks on demand, bounded collectives for the groups the suite creates). A rank that fails a
test by itself retires the group and tells its peers, so that none waits for it, or pairs that
test's collectives with the next one's. The plugin ends the session
with ``rankguard.shutdown``: a bounded barrier, then ``destroy_process_group``; a rank that
never arrives is named on every rank that did, the group is aborted instead, and those ranks'
sessions fail (exit status 1), so no rank waits forever and none reports success by mistake.
``-x`` is not needed for safety.
"""

from __future__ import annotations

import os
import sys

DEFAULT_SHUTDOWN_TIMEOUT_S = 60.0


def under_launcher() -> bool:
    """Whether this pytest process is one rank of a multi-rank job."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return False
    return (world > 1 and "RANK" in os.environ and "MASTER_ADDR" in os.environ
            and "MASTER_PORT" in os.environ)


def start() -> None:
    import rankguard

    rankguard.init()


def abandon(nodeid: str) -> None:
    """This rank failed ``nodeid`` by itself: its peers must not keep waiting for it in that
    test's collectives, nor pair them with the next test's."""
    if "rankguard.runtime.groups" in sys.modules and "torch.distributed" in sys.modules:
        from ..runtime import groups

        groups.abandon_world(f"rank {os.environ.get('RANK')} failed {nodeid}")


def finish(timeout: float) -> str | None:
    """The bounded end of a rank's session; a reason to fail it, or None."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    import rankguard

    report = rankguard.shutdown(timeout=timeout)
    if report.clean:
        return None
    _blame(report.missing)
    return f"session teardown: {report.detail}; the process group was aborted"


def _blame(missing: list[int]) -> None:
    """Under ``rankguard run``: the launcher blames the missing ranks, not this one."""
    from .. import ledger
    from ..runtime import instrument

    writer = instrument.state.ledger
    if writer is not None and missing:
        writer.record_blame(missing)
        writer.record_fault(ledger.FAULT_RAISED, True)
