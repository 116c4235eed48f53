"""torch's NCCL variables the user set: the values torch takes pass, the others are refused
before any rank starts, naming the variable (``inputs.nccl_env.check``), by ``rankguard run``,
``rankguard serve`` and ``rankguard.Pool``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import rankguard
from rankguard.errors import UsageError
from rankguard.inputs import nccl_env

from ..conftest import ROOT

TAKEN = [{}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}, {"TORCH_NCCL_ENABLE_MONITORING": "True"},
         {"TORCH_NCCL_DUMP_ON_TIMEOUT": " yes "}, {"TORCH_NCCL_ENABLE_TIMING": "1"},
         {"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "15000"}, {"TORCH_NCCL_BLOCKING_WAIT": "x"}]

REFUSED = {
    "an empty flag": ({"TORCH_NCCL_ENABLE_MONITORING": ""},
                      "TORCH_NCCL_ENABLE_MONITORING='': torch refuses it as an NCCL group forms"),
    "a flag torch does not spell": ({"TORCH_NCCL_DUMP_ON_TIMEOUT": "on"},
                                    "TORCH_NCCL_DUMP_ON_TIMEOUT='on': torch refuses it"),
    "an error-handling mode torch has not": ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "4"},
                                             "TORCH_NCCL_ASYNC_ERROR_HANDLING='4'"),
    "milliseconds with a unit (torch would read 15)": (
        {"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "15s"},
        "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC='15s': is not a whole number of milliseconds"),
    "negative milliseconds": ({"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "-1"},
                              "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC='-1'"),
    "milliseconds past a C int": ({"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "99999999999"},
                                  "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC='99999999999'"),
}


@pytest.mark.parametrize("env", TAKEN)
def test_the_values_torch_takes_pass(env: dict[str, str]) -> None:
    nccl_env.check(env)


@pytest.mark.parametrize("env, problem", REFUSED.values(), ids=REFUSED.keys())
def test_a_value_torch_refuses_is_refused_naming_the_variable(env: dict[str, str],
                                                              problem: str) -> None:
    with pytest.raises(UsageError) as refused:
        nccl_env.check(env)
    assert str(refused.value).startswith(problem), refused.value
    assert "unset it" in str(refused.value)


def test_rankguard_run_refuses_it_before_any_rank_starts(run_rankguard) -> None:
    run = run_rankguard(["--nproc-per-node", "1", "--no-python", "true"],
                        env={"TORCH_NCCL_DUMP_ON_TIMEOUT": "sometimes"})
    assert run.code == 2, run.stderr
    assert ("TORCH_NCCL_DUMP_ON_TIMEOUT='sometimes': torch refuses it as an NCCL group forms"
            in run.stderr)
    assert "Traceback" not in run.stderr


def test_a_pool_refuses_it_in_its_env_option() -> None:
    with pytest.raises(UsageError, match="TORCH_NCCL_ENABLE_TIMING='2'"):
        rankguard.Pool(2, None, env={"TORCH_NCCL_ENABLE_TIMING": "2"})


def test_rankguard_serve_refuses_it_before_it_listens() -> None:
    done = subprocess.run([sys.executable, "-m", "rankguard.cli", "serve",
                           "examples/serve_tp.py:app", "--port", "0"], cwd=ROOT,
                          env={**os.environ, "TORCH_NCCL_ENABLE_MONITORING": "maybe"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("rankguard serve: error: TORCH_NCCL_ENABLE_MONITORING='maybe'")
    assert "Traceback" not in done.stderr and "listening" not in done.stdout
