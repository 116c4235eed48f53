"""Rank-runtime scenarios, run as real rank processes: ``runtime_scenarios.py SCENARIO``.

Works the same under plain processes (env:// variables set by the test), stock torchrun and
``rankguard run``. Talks to the test through the folder ``$SCENARIO_DIR``: ``ready_<rank>``
holds the pid once the rank reached the point the test waits for, ``result_<rank>.json`` what
it observed. ``$SCENARIO_GRACE`` is the SIGTERM budget given to ``rankguard.init``.
"""
import json
import os
import signal
import sys
import time
from pathlib import Path

import rankguard

OUT = Path(os.environ["SCENARIO_DIR"])
RANK = int(os.environ.get("RANK", "0"))


def mark(name: str) -> None:
    tmp = OUT / f".{name}_{RANK}"
    tmp.write_text(str(os.getpid()))
    tmp.rename(OUT / f"{name}_{RANK}")


def report(**fields: object) -> None:
    tmp = OUT / f".result_{RANK}.json"
    tmp.write_text(json.dumps(fields))
    tmp.rename(OUT / f"result_{RANK}.json")


def freeze() -> None:
    mark("ready")
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)


def group():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    return torch, dist


def error_fields(error: rankguard.RankguardError, started: float) -> dict:
    return {"type": type(error).__name__, "op": getattr(error, "op", None),
            "seq": getattr(error, "seq", None), "missing": getattr(error, "missing", None),
            "waited": getattr(error, "waited", None), "message": str(error),
            "elapsed": time.monotonic() - started}


def sigterm_idle() -> None:
    mark("ready")
    time.sleep(60)


def sigterm_cpu() -> None:
    import torch

    a = torch.rand(256, 256)
    mark("ready")
    end = time.monotonic() + 60
    while time.monotonic() < end:
        a = (a @ a).clamp(-1, 1)


def sigterm_in_collective() -> None:
    torch, dist = group()
    if RANK == 1:
        freeze()
    mark("ready")
    dist.all_reduce(torch.ones(4))  # rank 1 never arrives
    report(returned=True)


def shutdown_peer(fault: str) -> None:
    torch, dist = group()
    if RANK == 2:
        if fault == "frozen":
            freeze()
        os._exit(3)
    started = time.monotonic()
    result = rankguard.shutdown(timeout=float(os.environ.get("SCENARIO_TIMEOUT", "2")))
    report(clean=result.clean, missing=result.missing, detail=result.detail,
           elapsed=time.monotonic() - started, initialized=dist.is_initialized())


def shutdown_all() -> None:
    group()
    started = time.monotonic()
    result = rankguard.shutdown(timeout=10)
    import torch.distributed as dist

    report(clean=result.clean, missing=result.missing, elapsed=time.monotonic() - started,
           initialized=dist.is_initialized())


def deadline_peer_frozen() -> None:
    torch, dist = group()
    if RANK == 1:
        freeze()
    started = time.monotonic()
    try:
        with rankguard.deadline(1.0):
            dist.all_reduce(torch.ones(4))
    except rankguard.CollectiveError as error:
        fields = error_fields(error, started)
        try:
            dist.all_reduce(torch.ones(4))
        except rankguard.GroupRetired as retired:
            fields["after"] = type(retired).__name__
        report(**fields)


def regroup_after_kill() -> None:
    torch, dist = group()
    started = time.monotonic()
    try:
        for step in range(1000):
            if RANK == 3 and step == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            t = torch.ones(4)
            dist.all_reduce(t)
            started = time.monotonic()
    except (rankguard.CollectiveError, rankguard.GroupRetired) as error:
        fields = error_fields(error, started)
        generation = rankguard.regroup(timeout=10)
        t = torch.ones(4)
        dist.all_reduce(t)
        report(**fields, generation=generation.number, rank=generation.rank,
               world_size=generation.world_size, took=generation.took, value=t[0].item(),
               env_rank=os.environ["RANK"], env_world=os.environ["WORLD_SIZE"])
        rankguard.shutdown(timeout=5)


def ddp_peer_dies() -> None:
    torch, dist = group()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    started = time.monotonic()
    try:
        for step in range(1000):
            if RANK == 1 and step == 3:
                os._exit(1)
            optimizer.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
            started = time.monotonic()
    except rankguard.CollectiveError as error:
        report(**error_fields(error, started), cause=type(error.__cause__).__name__)


SCENARIOS = {
    "sigterm_idle": sigterm_idle,
    "sigterm_cpu": sigterm_cpu,
    "sigterm_in_collective": sigterm_in_collective,
    "shutdown_peer_frozen": lambda: shutdown_peer("frozen"),
    "shutdown_peer_dead": lambda: shutdown_peer("dead"),
    "shutdown_all": shutdown_all,
    "deadline_peer_frozen": deadline_peer_frozen,
    "regroup_after_kill": regroup_after_kill,
    "ddp_peer_dies": ddp_peer_dies,
}

if __name__ == "__main__":
    rankguard.init(grace=float(os.environ.get("SCENARIO_GRACE", "3")))
    SCENARIOS[sys.argv[1]]()
