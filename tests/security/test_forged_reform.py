"""A suite every rank runs re-forms its group at the furthest test any rank reached: a position
that another process wrote into the store (unsealed) must not make the ranks skip tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..testing.test_plugin_session import every_rank_runs, outcome

FORGED_POSITION = '''
import time
import torch.distributed as dist
from rankguard.deadline import Deadline
from rankguard.runtime import generations

def test_both_fail_and_a_forged_position_waits_in_the_store():
    if dist.get_rank() == 1:
        # what any store client can write: rank 1 "reached" test_last (index 2), unsealed
        key = f"rankguard/pytest/reform{generations.next_number()}/at/1"
        generations.store_client(Deadline.after(5)).set(key, "2")
        time.sleep(1.0)  # rank 0 reaches the next test boundary first and reads the store
    assert False, f"rank {dist.get_rank()} fails by itself"

def test_runs_on_every_rank():
    pass

def test_last():
    pass
'''


@pytest.mark.slow
def test_a_forged_position_does_not_make_the_ranks_skip_tests(run_rankguard,
                                                              tmp_path: Path) -> None:
    run = every_rank_runs(run_rankguard, tmp_path, FORGED_POSITION, [],
                          ["-rA", "--rankguard-deadline", "60"])
    logs = {rank: (run.log_dir / "attempt0" / f"rank{rank}.log").read_text() for rank in (0, 1)}
    for rank in (0, 1):
        assert outcome(logs[rank], "test_runs_on_every_rank") == "PASSED", logs[rank][-4000:]
        assert outcome(logs[rank], "test_last") == "PASSED", logs[rank][-4000:]
