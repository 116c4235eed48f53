"""rankguard: distributed PyTorch jobs, servers and test suites that never hang.

``rankguard run`` launches a job (see ``rankguard.launcher``). Inside a rank, under any launcher:

- :func:`init` turns on the rank runtime: a SIGTERM teardown that works inside a collective,
  stacks on demand, and bounded collectives;
- :func:`deadline` bounds the collectives of a block; :func:`shutdown` is a teardown that cannot
  hang; :func:`regroup` forms a new process group of the survivors after a fault;
- :class:`StepLoop` runs a training loop in which a peer's fault costs no step: a replacement
  joins the group and receives the state from a healthy rank (``rankguard run --recovery
  in-place``).

In a server: :class:`Pool` runs each request on a group of rank processes; a fault fails that
request only, and the pool heals itself from spare replicas (see ``rankguard.serving``); in
its ranks, :func:`device` is the device the pool placed the rank on.

Importing rankguard does not import torch. Errors: see ``rankguard.errors``.

PYTEST_DONT_REWRITE: pytest marks this package for assertion rewriting as the home of a plugin,
and warns when it was imported before pytest (by ``rankguard run``'s bootstrap, in every rank of
``rankguard run ... -m pytest``), which ``-W error`` turns into an error at start; its asserts
are not a test's.
"""

from typing import TYPE_CHECKING

from .errors import (
    CollectiveError,
    CollectiveTimeout,
    GroupRetired,
    LedgerError,
    PeerFailed,
    PoolClosed,
    PoolError,
    PoolUnavailable,
    RankguardError,
    RequestFailed,
    TeardownTimeout,
    UsageError,
)

# eager: importing the module rankguard.deadline (the Deadline class, which every command
# imports) sets the package's attribute of that name, which must stay this function
from .runtime.deadline_scope import deadline

if TYPE_CHECKING:
    from .runtime.generations import Generation, regroup
    from .runtime.init import init
    from .runtime.shutdown import ShutdownReport, shutdown
    from .runtime.step_loop import Recovery, StepLoop
    from .serving.placement import device
    from .serving.pool import Pool, PoolStatus
    from .serving.service import Service

# The rest of the API is imported when first used (PEP 562), so that ``rankguard`` commands
# start at once: a Ctrl-C right after one started reaches the command, which ends it cleanly,
# instead of an import of the runtime and the serving layer.
_LAZY = {
    "Generation": ".runtime.generations",
    "regroup": ".runtime.generations", "init": ".runtime.init",
    "ShutdownReport": ".runtime.shutdown", "shutdown": ".runtime.shutdown",
    "Recovery": ".runtime.step_loop", "StepLoop": ".runtime.step_loop",
    "Pool": ".serving.pool", "PoolStatus": ".serving.pool", "Service": ".serving.service",
    "device": ".serving.placement",
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'rankguard' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"
__all__ = [
    "CollectiveError", "CollectiveTimeout", "Generation", "GroupRetired", "LedgerError",
    "PeerFailed", "Pool", "PoolClosed", "PoolError", "PoolStatus", "PoolUnavailable",
    "RankguardError", "Recovery", "RequestFailed", "Service", "ShutdownReport", "StepLoop",
    "TeardownTimeout", "UsageError",
    "__version__", "deadline", "device", "init", "regroup", "shutdown",
]
