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
         {"TORCH_NCCL_DUMP_ON_TIMEOUT": "yes"}, {"TORCH_NCCL_ENABLE_TIMING": "1"},
         {"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "15000"}, {"TORCH_NCCL_BLOCKING_WAIT": "x"},
         {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "03"},  # torch's std::stoi reads 3
         {"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": " +2147483647"},
         {"NCCL_ASYNC_ERROR_HANDLING": "2", "NCCL_ENABLE_TIMING": "false"}]

WHOLE = "is not a whole number from 0 to"
REFUSED = {
    "an empty flag": ({"TORCH_NCCL_ENABLE_MONITORING": ""},
                      "TORCH_NCCL_ENABLE_MONITORING='': torch refuses it as an NCCL group forms"),
    "a flag torch does not spell": ({"TORCH_NCCL_DUMP_ON_TIMEOUT": "on"},
                                    "TORCH_NCCL_DUMP_ON_TIMEOUT='on': torch refuses it"),
    "a flag with a blank (torch does not strip it)": ({"TORCH_NCCL_ENABLE_TIMING": " 1"},
                                                      "TORCH_NCCL_ENABLE_TIMING=' 1': torch"),
    "an error-handling mode torch has not": ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "4"},
                                             f"TORCH_NCCL_ASYNC_ERROR_HANDLING='4': {WHOLE} 3"),
    "torch's older name, misspelt": ({"NCCL_ASYNC_ERROR_HANDLING": "bogus"},
                                     f"NCCL_ASYNC_ERROR_HANDLING='bogus': {WHOLE} 3"),
    "torch's older name of the timing flag": ({"NCCL_ENABLE_TIMING": "on"},
                                              "NCCL_ENABLE_TIMING='on': torch refuses it"),
    "milliseconds with a unit (torch would read 15)": (
        {"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "15s"},
        f"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC='15s': {WHOLE} 2147483647"),
    "negative milliseconds": ({"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "-1"},
                              f"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC='-1': {WHOLE}"),
    "milliseconds past a C int": ({"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "2147483648"},
                                  f"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC='2147483648': {WHOLE}"),
}

# the user's environment -> the settings rankguard gives the ranks
SETTINGS = {
    "none set: rankguard's": ({}, nccl_env.NCCL_SETTINGS),
    "the user's value is kept": (
        {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}, {**nccl_env.NCCL_SETTINGS,
                                              "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}),
    "torch's older name set: the newer one is left unset (it would win over the user's)": (
        {"NCCL_ASYNC_ERROR_HANDLING": "3"},
        {name: value for name, value in nccl_env.NCCL_SETTINGS.items()
         if name != "TORCH_NCCL_ASYNC_ERROR_HANDLING"}),
}

# what rankguard.init() sets in its own process
UNDER_TORCHRUN = {"TORCHELASTIC_RUN_ID": "job", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
OWN = {
    "under stock torchrun, its agent's mode 1 is not the user's: 0": (
        UNDER_TORCHRUN, {**nccl_env.NCCL_SETTINGS}),
    "under stock torchrun, a mode the user chose (not torchrun's 1) is kept": (
        {**UNDER_TORCHRUN, "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"},
        {**nccl_env.NCCL_SETTINGS, "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}),
    "under rankguard run, mode 1 is the user's (the launcher gives 0 otherwise)": (
        {**UNDER_TORCHRUN, "RANKGUARD_LAUNCHER_PID": "7"},
        {**nccl_env.NCCL_SETTINGS, "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}),
    "outside torchrun, mode 1 is the user's": (
        {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
        {**nccl_env.NCCL_SETTINGS, "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}),
}


@pytest.mark.parametrize("env, expected", SETTINGS.values(), ids=SETTINGS.keys())
def test_the_settings_the_ranks_get(env: dict[str, str], expected: dict[str, str]) -> None:
    assert nccl_env.nccl_settings(env) == expected


@pytest.mark.parametrize("env, expected", OWN.values(), ids=OWN.keys())
def test_the_settings_init_makes_in_its_process(env: dict[str, str],
                                                expected: dict[str, str]) -> None:
    assert nccl_env.own_settings(env) == expected


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


@pytest.mark.parametrize("env, problem", [
    ({"A=B": "1"}, "Pool(env): 'A=B' is not a variable name"),
    ({"": "1"}, "Pool(env): '' is not a variable name"),
    ({1: "a"}, "Pool(env): 1 is not a variable name"),
    ({"A": 1}, "Pool(env): the value of A is 1, not a string"),
    ({"A": None}, "Pool(env): the value of A is None, not a string"),
    ({"A": "x\0y"}, "Pool(env): the value of A is 'x\\x00y', not a string"),
    ("A=1", "Pool(env): expected a dict of names to values, got 'A=1'"),
    ({"TORCH_FR_BUFFER_SIZE": "abc"}, "TORCH_FR_BUFFER_SIZE='abc': is not a number of entries"),
])
def test_a_pool_refuses_an_env_the_ranks_could_not_take(env: object, problem: str) -> None:
    with pytest.raises(UsageError) as refused:
        rankguard.Pool(2, None, env=env)
    assert str(refused.value).startswith(problem), refused.value
