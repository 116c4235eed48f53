"""A worker's warm mode: ``python -m rankguard.serving.worker --warm``, a rank process started
ahead of need, which becomes a rank of a replica when its leader hands it one
(``serving.warm_spares`` is the leader's side).

A rank forked from the pool's zygote has torch imported already, but CUDA does not survive a
fork: a rank on a GPU still pays CUDA's initialisation and its context. A warm rank is a process
of its own that has paid for both before it is needed. Its environment at start is the leader's
with the pool's ``env`` (the base every rank's environment is made from), and:

- :data:`CONTROL_FD_ENV`: its end of the control socket (a ``SOCK_SEQPACKET`` socket pair);
- :data:`DEVICE_ENV`: ``cpu`` or ``cuda:N``;
- ``leader_env.LEADER``: the leader's pid, its parent.

It then:

1. dies with the leader (PR_SET_PDEATHSIG), exiting at once if it is gone already;
2. warms up: imports torch and ``torch.distributed``; on ``cuda:N``, initialises CUDA
   (``torch.cuda.init``) and creates its context on that device (``set_device``, a tensor
   there), timing each :class:`WarmPart`;
3. says ``{"op": WarmOp.READY, "pid", "parts": {WarmPart: seconds}}`` on the control socket,
   or ``{"op": WarmOp.FAILED, "error"}`` (the traceback) and exits 1;
4. waits, with no deadline (an idle warm rank waits to be needed), for ``{"op": WarmOp.BECOME,
   "env", "cwd"}`` with two descriptors (SCM_RIGHTS): the rank's channel to the leader and its
   log. End of file instead (the leader closed the socket, or died) means it is not needed:
   exit 0;
5. sends its output to the log, moves to the leader's working folder ``cwd``, replaces its
   whole environment with ``env`` (the rank's complete environment, as a new process would get
   it), sets ``leader_env.FD`` to the number the channel got here, and returns:
   ``worker.main()`` goes on as that rank.

Nothing of the rank is read before step 5: the modules a worker imports read their environment
when called (``runtime.init``, the ledger, stacks), not when imported, and only torch and
``torch.distributed`` are imported ahead (``runtime.init`` instruments an already imported
``torch.distributed``, as in a rank forked from the zygote). What torch and CUDA read while
warming (``CUDA_VISIBLE_DEVICES``, ``PYTORCH_CUDA_ALLOC_CONF``, ``OMP_NUM_THREADS``) comes from
that shared base; NCCL's variables (``NCCL_HOSTID``) are read when the rank forms its group,
after step 5. A rank's marker (``supervisor.rank_processes.MARKER_VAR``) is in its environment
from step 5 on, and so in what it starts, but not in its own ``/proc/PID/environ``: its
supervisor knows it by its pid.
"""

from __future__ import annotations

import enum
import os
import pickle
import socket
import sys
import time
import traceback
from typing import Any

from ..processes import proctree
from . import leader_env

WARM_FLAG = "--warm"
CONTROL_FD_ENV = "RANKGUARD_WARM_FD"
DEVICE_ENV = "RANKGUARD_WARM_DEVICE"
MAX_MESSAGE = 1 << 20  # the rank's environment, pickled: a few kB


class WarmOp(enum.StrEnum):
    """A control message's kind (its ``op``)."""

    READY = "ready"  # warm -> leader: warmed up, waiting
    FAILED = "failed"  # warm -> leader: the warm-up raised
    BECOME = "become"  # leader -> warm: the rank's environment, channel and log


class WarmPart(enum.StrEnum):
    """One timed part of a warm-up."""

    IMPORT_TORCH = "import_torch"
    IMPORT_DISTRIBUTED = "import_distributed"
    CUDA_INIT = "cuda_init"  # CUDA's driver and runtime (torch.cuda.init)
    CUDA_CONTEXT = "cuda_context"  # the context on the warm rank's device


def warm_up(device: str) -> dict[WarmPart, float]:
    """Import torch and ``torch.distributed``; on a CUDA ``device``, initialise CUDA and create
    the context there. Returns the seconds of each part; raises what torch raises."""
    parts: dict[WarmPart, float] = {}
    started = time.monotonic()

    def part(name: WarmPart) -> None:
        nonlocal started
        now = time.monotonic()
        parts[name] = now - started
        started = now

    import torch

    part(WarmPart.IMPORT_TORCH)
    import torch.distributed  # noqa: F401

    part(WarmPart.IMPORT_DISTRIBUTED)
    if device.startswith("cuda"):
        torch.cuda.init()
        part(WarmPart.CUDA_INIT)
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)
        torch.cuda.synchronize(device)
        part(WarmPart.CUDA_CONTEXT)
    return parts


def become_rank() -> None:
    """Steps 1 to 5 of the module docstring; returns once this process is the rank (or exits:
    0 when it is not needed, 1 when its warm-up failed)."""
    control = socket.socket(fileno=int(os.environ[CONTROL_FD_ENV]))
    control.set_inheritable(False)  # what the rank starts must not hold the leader's socket
    proctree.die_with_parent(int(os.environ[leader_env.LEADER]))
    try:
        parts = warm_up(os.environ[DEVICE_ENV])
    except BaseException:  # noqa: BLE001 (told to the leader, whatever it is)
        detail = traceback.format_exc()
        print(detail, file=sys.stderr, flush=True)
        _tell(control, {"op": WarmOp.FAILED, "error": detail})
        os._exit(1)
    _tell(control, {"op": WarmOp.READY, "pid": os.getpid(), "parts": parts})
    try:
        data, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 2)
    except OSError:
        data, fds = b"", []
    if not data or len(fds) != 2:
        os._exit(0)  # not needed
    message = pickle.loads(data)
    channel, log = fds
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    control.close()
    os.chdir(message["cwd"])
    os.environ.clear()
    os.environ.update(message["env"])
    os.environ[leader_env.FD] = str(channel)
    sys.argv[1:] = []  # as a rank started cold


def _tell(control: socket.socket, message: dict[str, Any]) -> None:
    """Send ``message`` to the leader; a leader that closed the socket does not need this
    process: exit 0."""
    try:
        control.send(pickle.dumps(message))
    except OSError:
        os._exit(0)
