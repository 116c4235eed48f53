"""torch's Flight Recorder read in-process (runtime/fr_progress): real gloo ranks (two
processes, a real TCPStore) count their collectives per group, show the one they wait in, and
write dumps torch's own analyser reads; an off recorder is refused before torch is asked.
The pure parts (the buffer size as torch reads it, operation kinds) are tables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rankguard.processes import proctree
from rankguard.runtime import fr_progress as fr
from tests.conftest import ROOT, script
from tests.runtime.ranks import free_port

RANK_SCRIPT = script("fr_progress_rank.py")
DEADLINE_S = 90.0  # two cold torch imports on a loaded machine, then a few collectives
WORLD_OPS, SUB_OPS = 6, 3
# NCCL: both ranks on GPU 0 (a host of its own each, through NCCL_HOSTID, over sockets on lo),
# with the devices' start times recorded
NCCL_ENV = {"FR_BACKEND": "nccl", "TORCH_NCCL_ENABLE_TIMING": "1", "NCCL_P2P_DISABLE": "1",
            "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_NVLS_ENABLE": "0",
            "NCCL_COLLNET_ENABLE": "0", "NCCL_SOCKET_IFNAME": "lo"}
needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available()
    or not hasattr(torch._C._distributed_c10d, "_dump_nccl_trace_json"),
    reason="NCCL's Flight Recorder needs a CUDA GPU and a CUDA build of torch")
BACKENDS = [pytest.param({}, id="gloo"),
            pytest.param(NCCL_ENV, id="nccl", marks=[pytest.mark.gpu, needs_gpu])]


def _run(scenario: str, folder: Path, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run two ranks of ``scenario``; what each printed (its last line, as JSON)."""
    port = str(free_port())
    procs = []
    try:
        for rank in range(2):
            rank_env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                        "RANK": str(rank), "WORLD_SIZE": "2", "NCCL_HOSTID": f"host{rank}",
                        **(env or {})}
            procs.append(subprocess.Popen(
                [sys.executable, RANK_SCRIPT, scenario, str(WORLD_OPS), str(SUB_OPS),
                 str(folder)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                cwd=str(ROOT), env=rank_env, start_new_session=True))
        reports = []
        for proc in procs:
            out, err = proc.communicate(timeout=DEADLINE_S)
            assert proc.returncode == 0, f"exit {proc.returncode}:\n{out}\n{err[-3000:]}"
            reports.append(json.loads(out.strip().splitlines()[-1]))
        return reports
    finally:
        for proc in procs:
            if proc.poll() is None:
                proctree.signal_tree(proc.pid, signal.SIGKILL)
                proc.communicate(timeout=10)


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.parametrize("env", BACKENDS)
def test_each_group_counts_its_collectives_and_the_dumps_are_read_by_torchs_analyser(
        tmp_path: Path, env: dict[str, str]) -> None:
    reports = _run("counts", tmp_path, env)
    nccl = bool(env)
    for rank, report in enumerate(reports):
        # one group of WORLD_OPS (the default group, torch's id 0 on gloo), one of SUB_OPS
        by_size = sorted(report["groups"].items(), key=lambda group: group[1]["enqueued"])
        for (pg_id, counts), ops in zip(by_size, (SUB_OPS, WORLD_OPS), strict=True):
            # gloo knows no "started", and torch's gloo count of completions may stay behind
            # (torch 2.13: seen 5 of 6 ten seconds after the last one, and 2 of 6 on a loaded
            # machine): there the entries show how far the group got (completed_upto), which
            # is what rankguard reads; NCCL with timing knows both
            assert counts["enqueued"] == ops, (rank, report)
            assert counts["started"] == (ops if nccl else -1), (rank, report)
            if nccl:
                assert counts["completed"] == ops, (rank, report)
            else:
                assert counts["completed"] <= ops, (rank, report)
                assert report["upto"][pg_id] == ops, (rank, report)
        if nccl:
            assert {c["desc"]: c["ranks"] for c in report["configs"].values()}["default_pg"] \
                == [0, 1]
        else:
            assert report["configs"] == {}  # torch lists no gloo group by name (2.13)
        assert report["dump"] == str(tmp_path / f"{fr.DUMP_PREFIX}{rank}")
    # torch's own analyser, on the dumps, names the collective rank 1 had not reached
    analysed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(tmp_path)],
        capture_output=True, text=True, timeout=DEADLINE_S)
    found = analysed.stdout + analysed.stderr
    assert analysed.returncode == 0, found[-3000:]
    assert f"Not all ranks joining collective, sequence number: {SUB_OPS + 1}" in found, found
    assert "missing ranks: {1}" in found, found


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.parametrize("env", BACKENDS)
def test_the_operation_a_rank_waits_in_is_active_with_its_group_number_and_kind(
        tmp_path: Path, env: dict[str, str]) -> None:
    rank0, rank1 = _run("pending", tmp_path, env)
    # rank 0 waited in the default group's 7th collective while rank 1 slept (NCCL: its GPU
    # may have started it)
    [op] = rank0["active"]
    assert (op["seq"], op["kind"]) == (WORLD_OPS + 1, "all_reduce")
    assert op["state"] in (("scheduled", "started") if env else ("scheduled",))
    assert op["group"] == "0"  # the default group's name
    assert rank0["groups"][str(op["pg_id"])]["enqueued"] == WORLD_OPS + 1


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_an_off_recorder_is_refused_cleanly_without_asking_torch(tmp_path: Path) -> None:
    for report in _run("off", tmp_path, {"TORCH_FR_BUFFER_SIZE": "0"}):
        assert report["refused"] == (
            "torch's cpu Flight Recorder: it is off (its buffer size is 0) (set "
            "TORCH_FR_BUFFER_SIZE=2000 before the first process group is made)")


@pytest.mark.parametrize("env, size", [
    ({}, fr.DEFAULT_ENTRIES),
    ({"TORCH_FR_BUFFER_SIZE": "0"}, 0),
    ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, 0),
    ({"TORCH_FR_BUFFER_SIZE": "100", "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, 100),
    ({"TORCH_FR_BUFFER_SIZE": "0", "TORCH_NCCL_TRACE_BUFFER_SIZE": "100"}, 0),
], ids=["unset: torch's default", "TORCH_FR_BUFFER_SIZE=0 turns it off",
        "the deprecated name alone counts", "TORCH_FR_BUFFER_SIZE wins (on)",
        "TORCH_FR_BUFFER_SIZE wins (off)"])
def test_the_buffer_size_is_read_as_torch_reads_it(env: dict[str, str], size: int) -> None:
    assert fr.buffer_size(env) == size


def test_a_buffer_size_torch_refuses_is_refused_naming_the_variable() -> None:
    with pytest.raises(fr.FlightRecorderUnavailable) as caught:
        fr.FlightRecorderReader(fr.Recorder.CPU, {"TORCH_FR_BUFFER_SIZE": "lots"})
    assert str(caught.value) == ("torch's cpu Flight Recorder: TORCH_FR_BUFFER_SIZE='lots' is "
                                 "not a number of entries (set TORCH_FR_BUFFER_SIZE=2000)")


@pytest.mark.skipif(hasattr(torch._C._distributed_c10d, "_dump_nccl_trace_json"),
                    reason="this torch has NCCL's recorder")
def test_the_nccl_recorder_is_refused_on_a_torch_without_it() -> None:
    with pytest.raises(fr.FlightRecorderUnavailable, match="this torch has no "
                       r"_dump_nccl_trace_json \(NCCL groups need a CUDA build of torch\)"):
        fr.FlightRecorderReader(fr.Recorder.NCCL, {})


@pytest.mark.parametrize("name, kind", [
    ("nccl:all_reduce", "all_reduce"),
    ("gloo:all_reduce", "all_reduce"),
    ("nccl:send 0->1", "send"),
    ("nccl:recv 1<-0", "recv"),
    ("nccl:_allgather_base", "all_gather_into_tensor"),
    ("nccl:_reduce_scatter_base", "reduce_scatter_tensor"),
    ("nccl:all_reduce_barrier", "barrier"),
    ("nccl:coalesced", "coalesced"),
    ("all_reduce", "all_reduce"),
], ids=lambda value: value)
def test_torchs_profiling_names_become_the_ledgers_kinds(name: str, kind: str) -> None:
    assert fr.op_kind(name) == kind


@pytest.mark.parametrize("env, on", [({}, False), ({"TORCH_NCCL_ENABLE_TIMING": "1"}, True),
                                     ({"TORCH_NCCL_ENABLE_TIMING": "0"}, False),
                                     ({"TORCH_NCCL_ENABLE_TIMING": "true"}, True)])
def test_nccl_timing_is_on_only_when_set_true(env: dict[str, str], on: bool) -> None:
    assert fr.timing_on(env) is on


def _op(seq: int, completed: bool, pg_id: int = 0) -> fr.Entry:
    return fr.Entry(pg_id, "0", seq, "all_reduce", "scheduled", 0, completed)


COMPLETED_UPTO = {
    "every entry of the group completed: its last": ([_op(3, True), _op(4, True)], 4),
    "gloo's worker threads finished #4 before #3: #3 is still the first not completed":
        ([_op(2, True), _op(3, False), _op(4, True)], 2),
    "the first not completed, less one, whatever follows": ([_op(5, False), _op(6, False)], 4),
    "another group's entries say nothing about this one":
        ([_op(7, False, pg_id=1), _op(3, True), _op(8, True, pg_id=1)], 3),
    "a group with no entry in the ring: not known": ([_op(7, True, pg_id=1)], None),
}


@pytest.mark.parametrize("entries, upto", COMPLETED_UPTO.values(), ids=COMPLETED_UPTO.keys())
def test_a_group_got_as_far_as_its_entries_show_completed_without_a_gap(
        entries: list[fr.Entry], upto: int | None) -> None:
    assert fr.completed_upto(entries, 0) == upto


IN_ORDER = {  # (the entries not completed, torch's enqueued count) -> how far the group got
    "no entry active: every enqueued one completed": (([], 5), 5),
    "a captured #4 never completes, the eager #5 after it did: #5": (([_op(4, False)], 5), 5),
    "#4 stuck with #5 queued behind it: #3": (([_op(4, False), _op(5, False)], 5), 3),
    "the last enqueued is active: the one before it": (([_op(5, False)], 5), 4),
    "another group's active entries say nothing about this one":
        (([_op(5, False, pg_id=1)], 5), 5),
    "nothing enqueued yet": (([], 0), 0),
}


@pytest.mark.parametrize("given, upto", IN_ORDER.values(), ids=IN_ORDER.keys())
def test_an_nccl_group_got_as_far_as_its_last_enqueued_operation_not_active(
        given: tuple[list[fr.Entry], int], upto: int) -> None:
    active, enqueued = given
    assert fr.completed_in_order(active, 0, enqueued) == upto
