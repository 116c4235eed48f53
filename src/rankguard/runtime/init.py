"""``rankguard.init()``: the rank runtime in any torch.distributed program.

Under ``rankguard run`` the bootstrap turns on most of this by itself; ``init()`` is for
programs started by stock ``torchrun``, ``mp.spawn`` or anything else, and adds bounded mode
under ``rankguard run``. Call it early, from the main thread, before ``init_process_group``.
"""

from __future__ import annotations

import os

from ..records import ledger as _ledger
from ..errors import UsageError
from ..inputs import nccl_env
from . import deadline_scope
from . import eviction, instrument, stacks
from .state import current

GRACE_ENV = "RANKGUARD_GRACE"
COLLECTIVE_TIMEOUT_ENV = "RANKGUARD_COLLECTIVE_TIMEOUT"


def grace_from_env() -> float:
    """The SIGTERM teardown budget the supervisor asked for, else the default."""
    value = os.environ.get(GRACE_ENV)
    if not value:
        return eviction.DEFAULT_GRACE_S
    return deadline_scope.check_seconds(GRACE_ENV, value)


def init(*, grace: float | None = None, collective_timeout: float | None = None,
         stacks_file: str | None = None) -> None:
    """Turn on the rank runtime in this process. Safe to call more than once.

    After it:

    - SIGTERM tears the rank down cleanly and exits 0 within ``grace`` seconds, even while the
      main thread is blocked inside a collective (see ``rankguard.runtime.eviction``);
    - ``SIGUSR1`` makes the rank append the stacks of all its threads to ``stacks_file``;
    - process groups created afterwards on gloo are instrumented and **bounded**: collectives
      honour ``rankguard.deadline()`` and ``collective_timeout``, and a failed collective raises
      a ``rankguard.CollectiveError`` that names the ranks that had not arrived;
    - torch's NCCL settings rankguard needs (``inputs.nccl_env``: rankguard's abort decides,
      not torch's watchdog, which would kill the process on a peer's remote error or sleep a
      minute after it) are set in ``os.environ`` for the NCCL groups made afterwards, except
      where already set (the ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` stock torchrun gives where
      the user set none excepted); a value of them torch would refuse is refused here.

    Args:
        grace: SIGTERM teardown budget in seconds (default ``$RANKGUARD_GRACE`` or 5).
        collective_timeout: deadline of every collective in seconds (default
            ``$RANKGUARD_COLLECTIVE_TIMEOUT`` or none).
        stacks_file: where stack dumps go (default ``$RANKGUARD_STACKS``, else
            ``$TMPDIR/rankguard-<uid>/stacks-<pid>.txt``, removed at exit if nothing was
            dumped).

    Raises:
        UsageError: a bad argument or environment value, a stacks file that is not a path or
            cannot be opened (or a user folder under the temp folder that is not private to the
            user), a call
            from another thread than the main thread, or a default process group that already exists and was not created
            through rankguard (create it after ``init()``).
    """
    grace = (deadline_scope.check_seconds("grace", grace, text=False) if grace is not None
             else grace_from_env())
    if collective_timeout is None and os.environ.get(COLLECTIVE_TIMEOUT_ENV):
        collective_timeout = deadline_scope.check_seconds(COLLECTIVE_TIMEOUT_ENV,
                                                     os.environ[COLLECTIVE_TIMEOUT_ENV])
    nccl_env.check(os.environ)
    if collective_timeout is not None:
        deadline_scope.set_default(collective_timeout)
    eviction.install(grace)
    stacks.install(stacks_file)
    state = current()
    if state.ledger is None and os.environ.get(_ledger.PATH_ENV):
        state.ledger = _ledger.LedgerWriter(os.environ[_ledger.PATH_ENV])
    if state.ledger is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
        state.ledger = _ledger.LedgerWriter.private(world_size)
    state.enable_bounded()
    os.environ.update(nccl_env.own_settings(os.environ))  # as rankguard run's ranks get them
    _instrument_torch()


def _instrument_torch() -> None:
    try:
        import torch.distributed as dist
    except ImportError:  # no torch here: SIGTERM and stacks are all there is to protect
        return
    instrument.install()
    if not dist.is_available() or not dist.is_initialized():
        return
    from torch.distributed import distributed_c10d as c10d

    world = c10d._get_default_group()
    if current().groups.of(world) is None:
        raise UsageError("rankguard.init()", "the default process group already exists and was "
                         "not created through rankguard, so its collectives cannot be bounded",
                         "call rankguard.init() before torch.distributed.init_process_group()")
    if current().responder is None:
        instrument.start_probing(c10d._get_default_store(), dist.get_rank(),
                                 dist.get_world_size())

