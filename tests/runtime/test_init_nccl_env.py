"""``rankguard.init()`` sets torch's NCCL settings rankguard needs in its own process (before
its NCCL groups form), keeping the user's: read back in a real process after init."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankguard.inputs.nccl_env import NCCL_SETTINGS

READ_BACK = ("import json, os, rankguard; rankguard.init(); "
             f"print(json.dumps({{n: os.environ.get(n) for n in {list(NCCL_SETTINGS)!r}}}))")


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.parametrize("user, expected", [
    ({}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_ENABLE_MONITORING": "0",
          "TORCH_NCCL_DUMP_ON_TIMEOUT": "0", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "0"}),
    ({"TORCH_NCCL_ENABLE_MONITORING": "1", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "500"},
     {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_ENABLE_MONITORING": "1",
      "TORCH_NCCL_DUMP_ON_TIMEOUT": "0", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "500"}),
])
def test_init_sets_the_nccl_settings_unless_the_user_did(user: dict[str, str],
                                                         expected: dict[str, str]) -> None:
    env = {name: value for name, value in os.environ.items() if name not in NCCL_SETTINGS}
    done = subprocess.run([sys.executable, "-c", READ_BACK], env={**env, **user},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == expected


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_under_stock_torchrun_init_turns_its_agents_error_handling_mode_off(
        tmp_path: Path) -> None:
    # torchrun's agent gives every rank TORCH_NCCL_ASYNC_ERROR_HANDLING=1 where its own
    # environment has none: torch's watchdog would tear the rank down on a peer's death
    script = tmp_path / "read_back.py"
    script.write_text(READ_BACK.replace("; ", "\n"))
    env = {name: value for name, value in os.environ.items() if name not in NCCL_SETTINGS}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           "1", "--standalone", str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == NCCL_SETTINGS


def test_init_refuses_a_value_torch_would_refuse_naming_it() -> None:
    env = {**os.environ, "TORCH_NCCL_DUMP_ON_TIMEOUT": "on"}
    done = subprocess.run([sys.executable, "-c", READ_BACK], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert ("UsageError: TORCH_NCCL_DUMP_ON_TIMEOUT='on': torch refuses it as an NCCL group "
            "forms" in done.stderr), done.stderr
