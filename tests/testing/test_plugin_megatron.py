"""The Megatron-LM case on gloo (``megatron_case``): under ``torchrun -m pytest`` and under
``rankguard run -m pytest``, rank 1 failing a test while rank 0 waits for it in an all_reduce,
then the session fixture's ``barrier()`` and ``destroy_process_group()``, end bounded, both
ranks' failures reported, nothing left running (the suite's own check). The same on NCCL is in
tests/gpu/test_nccl_session_fixture.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from . import megatron_case as case

DEADLINE = 20.0  # each test's: a hang would cost one, the failures cost none


@pytest.mark.slow  # two ranks of pytest (8 s idle)
def test_under_torchrun_a_failing_rank_and_its_waiting_peer_end_bounded_and_reported(
        tmp_path: Path) -> None:
    case.check_bounded_and_both_reported(case.under_torchrun(tmp_path, "gloo", DEADLINE),
                                         DEADLINE)


@pytest.mark.slow  # two ranks of pytest (8 s idle)
def test_under_rankguard_run_a_failing_rank_and_its_waiting_peer_end_bounded_and_reported(
        run_rankguard: Any, tmp_path: Path) -> None:
    run = case.under_rankguard(run_rankguard, tmp_path, "gloo", DEADLINE)
    case.check_bounded_and_both_reported(run, DEADLINE)
