"""The tester's attack on ``rankguard serve``: forged notices pushed into a pool group's store
made every request fail with GroupRetired. Each group's ranks now hold a secret of their own."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest

import rankguard

from ..runtime.test_store_seal import prefixes
from ..serving import rank_functions as rf

SETTLE_S = 0.5  # a notice is acted on right after it is popped; the ranks had this long


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.deadline(120)
def test_forged_notices_in_a_pool_groups_store_do_not_fail_its_requests() -> None:
    from torch.distributed import TCPStore

    with rankguard.Pool(2, rf.load, spares=0, timeout=5) as pool:
        assert pool.run(rf.forward, 1.0) == rf.expected(1.0, 2)
        port = pool._dispatch.ready[0]._store.port  # any client that reaches the port can do this
        outsider = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        prefix = prefixes(outsider)[1]
        queues = [f"{prefix}rankguard/probe/g0/{rank}" for rank in (0, 1)]
        for rank, queue in enumerate(queues):
            outsider.queue_push(queue, json.dumps(
                {"id": f"forged-{rank}", "group": "world",
                 "notice": {"by": 1 - rank, "reason": "forged by an outsider"}}))
        deadline = time.monotonic() + 10
        while any(outsider.queue_len(queue) for queue in queues):  # each responder popped it
            assert time.monotonic() < deadline, "the ranks never read their probe queues"
            time.sleep(0.01)
        time.sleep(SETTLE_S)
        assert pool.run(rf.forward, 2.0) == rf.expected(2.0, 2)
