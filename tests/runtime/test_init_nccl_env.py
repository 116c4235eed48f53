"""``rankguard.init()`` sets torch's NCCL settings rankguard needs in its own process (before
its NCCL groups form), keeping the user's: read back in a real process after init."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rankguard.inputs.nccl_env import NCCL_SETTINGS

READ_BACK = ("import json, os, rankguard; rankguard.init(); "
             f"print(json.dumps({{n: os.environ.get(n) for n in {list(NCCL_SETTINGS)!r}}}))")


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
