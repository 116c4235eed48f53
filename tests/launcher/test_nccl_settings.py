"""The NCCL settings ``rankguard run`` gives its ranks, and the user's that it keeps: read from a
real rank's environment (``--no-python env``)."""

from __future__ import annotations

import pytest

from rankguard.inputs.nccl_env import NCCL_SETTINGS


def rank_env(run_rankguard, env: dict[str, str]) -> dict[str, str]:
    run = run_rankguard(["--nproc-per-node", "1", "--no-python", "env"], env=env)
    assert run.code == 0, run.stderr
    return dict(line.removeprefix("[rank0]:").partition("=")[::2]
                for line in run.stdout.splitlines() if "=" in line)


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_ranks_get_the_nccl_settings_rankguard_needs(run_rankguard, monkeypatch):
    for name in NCCL_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    seen = rank_env(run_rankguard, {})
    assert {name: seen.get(name) for name in NCCL_SETTINGS} == {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_ENABLE_MONITORING": "0",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "0", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "0"}
    assert "TORCH_NCCL_ENABLE_TIMING" not in seen  # costly: the user's choice (README)


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.parametrize("name, value", [("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"),
                                         ("TORCH_NCCL_ENABLE_TIMING", "1"),
                                         ("TORCH_NCCL_ENABLE_MONITORING", "false"),
                                         ("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "15000")])
def test_a_setting_the_user_made_is_kept(run_rankguard, name, value):
    assert rank_env(run_rankguard, {name: value})[name] == value
