"""One rank of a pool's replica: ``python -m rankguard.serving.worker``.

Started by ``serving.replica.Replica`` with the env:// variables of its rank and one end of a
channel to the leader (``RANKGUARD_SERVE_FD``). It turns on the rank runtime (``runtime.init``:
SIGTERM teardown, stacks on demand, bounded collectives), dies with the leader
(PR_SET_PDEATHSIG), makes the leader's modules importable, and then:

Its messages are dicts whose ``op`` is a ``serving.messages.Op``:

1. receives ``{"op": "start", "setup": fn | None}``, joins the replica's process group (the
   backend and this rank's device are in its environment, ``serving.placement``: on a CUDA
   device, it is made the current device first, so that the NCCL group and the setup use it)
   and runs ``setup(rank, world_size)``; answers ``{"op": "ready", "pid", "began", "parts"}``
   (``began``: when its code started, on the monotonic clock; the seconds each step took:
   ``init`` (the rank runtime, torch imported), ``device``, ``group``, ``setup``), or
   ``setup_failed`` with the traceback. A **replacement** (``RANKGUARD_REPLACING=1``, started
   after its place's process was found unusable) joins the survivors' new generation instead
   of generation 0 (``runtime.vacancies``) and runs the setup as any rank does: its state is
   its own, not a peer's;
2. serves requests, one at a time:

   - ``{"op": "run", "id", "fn", "args", "kwargs", "deadline", "all", "keep_group"}``: call
     ``fn(state, *args, **kwargs)`` with every collective bounded by ``deadline`` (the
     leader's :class:`~rankguard.deadline.Deadline`, the same instant on this machine's
     monotonic clock); answer ``{"id", "ok": True, "result"}`` (the result from rank 0 only,
     unless ``all``) or ``{"id", "ok": False, "error", "message", "traceback", "collective",
     "missing", "at"}`` (``at``: when it failed, on the monotonic clock, comparable between
     ranks). A rank that fails by itself first retires the group and tells its peers, so none
     of them waits for it. With ``keep_group`` (a pool's calls), a call that destroyed the
     process group fails, naming it (the pytest plugin's tests may destroy it: their caller
     replaces the ranks after such a test).
   - ``{"op": "regroup", "deadline", "vacant"}``: a fresh generation after a failure, of the
     same ranks, or (``vacant`` places) of the survivors, which keep their ranks and wait for
     replacements to fill the vacant places.
   - ``{"op": "exit", "deadline"}``: a bounded shutdown, then exit 0.

With ``--warm`` it is a warm rank first (``serving.warm_worker``): it imports torch (and on a GPU
initialises CUDA) before it is needed, waits for the environment of the rank it becomes, and then
goes on as above.

It imports the rank runtime's modules, not the package face ``rankguard`` (which imports the
pool, and so this module's own leader side).

The leader closing the channel makes the rank exit.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import pickle
import sys
import time
import traceback
from typing import Any

from ..processes import proctree
from ..deadline import Deadline
from ..errors import CollectiveError, GroupRetired, RankguardError
from ..inputs.pyfiles import import_file
from ..runtime import internal
from ..runtime.init import init
from .budgets import SHUTDOWN_LEAST_S
from .channel import ChannelClosed, RankEnd
from . import messages
from .messages import Op
from .leader_env import FD, LEADER, MAIN, SYS_PATH
from .placement import BACKEND_ENV, CPU, DEVICE_ENV, Backend
from .warm_worker import WARM_FLAG, become_rank


def _adopt_leader_paths() -> None:
    for path in reversed(json.loads(os.environ.get(SYS_PATH, "[]"))):
        if path not in sys.path:
            sys.path.insert(0, path)


class _LeaderMain:
    """The leader's main module, imported here (as ``__mp_main__``, so its ``if __name__ ==
    "__main__"`` block does not run) the first time a message refers to one of its names."""

    module: Any = None

    @classmethod
    def get(cls) -> Any:
        if cls.module is None:
            reference = os.environ.get(MAIN, "")
            if reference.startswith("name:"):
                cls.module = importlib.import_module(reference[5:])
            elif reference.startswith("path:"):
                cls.module = import_file(reference[5:], "__mp_main__")
            else:
                cls.module = sys.modules["__main__"]
        return cls.module


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "__main__":
            return getattr(_LeaderMain.get(), name)
        return super().find_class(module, name)


def _loads(data: bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()


def _failure(error: BaseException, message: str | None = None) -> dict[str, Any]:
    collective = isinstance(error, (CollectiveError, GroupRetired))
    return messages.failure(error, message=message, traceback=traceback.format_exc(),
                            collective=collective,
                            missing=(getattr(error, "missing", []) or []) if collective else ())


def _run(command: dict[str, Any], state: Any, rank: int) -> dict[str, Any]:
    try:
        with internal.until(command["deadline"]):
            result = command["fn"](state, *command["args"], **command["kwargs"])
        if command.get("keep_group"):
            _check_group_kept()
        answer = {"ok": True, "result": result if rank == 0 or command["all"] else None}
    except BaseException as error:  # noqa: BLE001 (reported to the leader, whatever it is)
        answer = _failure(error)
        if not answer["collective"]:
            internal.abandon_world(f"rank {rank} raised {type(error).__name__}")
    return answer


def _check_group_kept() -> None:
    """Raises if the call destroyed the rank's process group: the next call, someone else's,
    would otherwise fail with torch's 'Default process group has not been initialized'."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("the call destroyed the replica's process group "
                           "(torch.distributed.destroy_process_group): a call must leave it in "
                           "place (the pool replaces the replica)")


def _join_group(parts: dict[str, float]) -> None:
    """Form the replica's process group on the backend and device the leader placed this rank
    on (``serving.placement``): a CUDA device becomes the current one (its context made)
    before the group (NCCL binds each rank's communicator to it) and before the setup (its
    tensors go there). ``parts`` gets the seconds each step took."""
    import torch
    import torch.distributed as dist

    device = os.environ.get(DEVICE_ENV) or CPU
    started = time.monotonic()
    if device != CPU:
        torch.cuda.set_device(device)
        torch.cuda.synchronize()
    parts["device"] = time.monotonic() - started
    started = time.monotonic()
    dist.init_process_group(os.environ.get(BACKEND_ENV) or str(Backend.GLOO))
    parts["group"] = time.monotonic() - started


def _regroup(command: dict[str, Any]) -> dict[str, Any]:
    vacant = list(command.get("vacant") or [])
    try:
        internal.regroup(command["deadline"], exclude=vacant, keep_size=bool(vacant))
        return {"op": Op.REGROUPED, "ok": True}
    except RankguardError as error:
        return {"op": Op.REGROUPED, "ok": False, "message": str(error)}


def main() -> None:
    if sys.argv[1:] == [WARM_FLAG]:
        become_rank()  # a warm rank: from here on, the rank it was handed
    began = time.monotonic()
    init()  # its SIGTERM teardown budget: the RANKGUARD_GRACE the replica set
    parts = {"init": time.monotonic() - began}  # the rank runtime, torch imported
    proctree.die_with_parent(int(os.environ[LEADER]))
    end = RankEnd(int(os.environ[FD]))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        _adopt_leader_paths()
        hello = end.receive(_loads)
        _join_group(parts)
        internal.state_loaded()
        setup, started = hello["setup"], time.monotonic()
        state = setup(rank, world) if setup is not None else None
        parts["setup"] = time.monotonic() - started
    except ChannelClosed:
        os._exit(0)
    except BaseException as error:  # noqa: BLE001 (reported to the leader, whatever it is)
        end.send({"op": Op.SETUP_FAILED, **_failure(error)})
        os._exit(1)
    end.send({"op": Op.READY, "pid": os.getpid(), "began": began,
              "parts": {part: round(took, 4) for part, took in parts.items()}})
    while True:
        try:
            command = end.receive(_loads)
        except ChannelClosed:
            os._exit(0)
        except Exception as error:  # noqa: BLE001 (a request whose function cannot be loaded)
            end.send({"op": Op.ANSWER, "id": None, **_failure(error)})
            continue
        op = command["op"]
        if op == Op.RUN:
            answer = {"op": Op.ANSWER, "id": command["id"], **_run(command, state, rank)}
            try:
                end.send(answer)
            except OSError:
                raise  # the leader is gone
            except Exception as error:  # noqa: BLE001 (whatever pickling the result raised)
                end.send({"op": Op.ANSWER, "id": command["id"], **_failure(
                    error, f"its result cannot be pickled: {messages.text_of(error)}")})
        elif op == Op.REGROUP:
            end.send(_regroup(command))
        else:
            limit: Deadline = command["deadline"]
            internal.shutdown(limit if limit.remaining() >= SHUTDOWN_LEAST_S
                              else Deadline.after(SHUTDOWN_LEAST_S))
            end.send({"op": Op.BYE})
            os._exit(0)


if __name__ == "__main__":
    main()
