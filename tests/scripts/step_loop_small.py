"""A small ``rankguard.StepLoop`` job: one all_reduce per step (``STEPS``, default 20, each
``ST`` seconds, default 0.05); state ``{"w": w}``. ``CHILD=1``: each rank first starts a
``sleep`` child that outlives it unless its tree is stopped (its pid goes to
``CHILD_DIR/rank<R>-<pid>``). ``EXIT_AFTER=R``: rank R exits with code 3 once its loop has ended,
in the first attempt (the others wait 2 s after their loop). ``STOP_REPLACEMENT=1``: a
replacement stops itself (SIGSTOP) before it joins. ``KILL_IN_REBUILD=R`` (with ``PID_DIR``,
where each rank's process writes its pid): every rank all-reduces in its ``on_regroup``
callback, and the first replacement of another rank, holding the state, SIGKILLs rank R's process
there first, once: the resume that brought it the state fails in the rebuild."""

import os
import signal
import subprocess
import time

import torch
import torch.distributed as dist

import rankguard

if os.environ.get("STOP_REPLACEMENT") == "1" and os.environ.get("RANKGUARD_REPLACING") == "1":
    os.kill(os.getpid(), signal.SIGSTOP)
dist.init_process_group("gloo")
rank = dist.get_rank()
if os.environ.get("CHILD") == "1":
    child = subprocess.Popen(["sleep", "1000"])
    with open(os.path.join(os.environ["CHILD_DIR"], f"rank{rank}-{os.getpid()}"), "w") as f:
        f.write(str(child.pid))
w = torch.zeros(4)


def load_state(state: dict) -> None:
    w.copy_(state["w"])


def step(n: int) -> None:
    t = torch.ones(4) * (rank + 1)
    dist.all_reduce(t)
    w.add_(t)
    time.sleep(float(os.environ.get("ST", "0.05")))


loop = rankguard.StepLoop(lambda: {"w": w}, load_state)
if os.environ.get("KILL_IN_REBUILD"):
    victim, pids = int(os.environ["KILL_IN_REBUILD"]), os.environ["PID_DIR"]
    with open(os.path.join(pids, f"rank{rank}"), "w") as f:
        f.write(str(os.getpid()))

    def rebuild() -> None:
        killed = os.path.join(pids, "killed")
        if os.environ.get("RANKGUARD_REPLACING") == "1" and rank != victim \
                and not os.path.exists(killed):
            open(killed, "w").close()
            with open(os.path.join(pids, f"rank{victim}")) as f:
                os.kill(int(f.read()), signal.SIGKILL)
        dist.all_reduce(torch.ones(1))

    loop.on_regroup(rebuild)
loop.run(step, int(os.environ.get("STEPS", "20")))
print(f"rank {rank} done w={w.tolist()}", flush=True)
if os.environ.get("EXIT_AFTER") and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    if os.environ["EXIT_AFTER"] == str(rank):
        os._exit(3)
    time.sleep(2)  # alive when the launcher judges its peer's exit
