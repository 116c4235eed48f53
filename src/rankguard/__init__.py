"""rankguard: distributed PyTorch jobs, servers and test suites that never hang.

``rankguard run`` launches a job (see ``rankguard.launcher``). Inside a rank, under any launcher:

- :func:`init` turns on the rank runtime: a SIGTERM teardown that works inside a collective,
  stacks on demand, and bounded collectives;
- :func:`deadline` bounds the collectives of a block; :func:`shutdown` is a teardown that cannot
  hang; :func:`regroup` forms a new process group of the survivors after a fault.

Importing rankguard does not import torch. Errors: see ``rankguard.errors``.
"""

from .errors import (
    CollectiveError,
    CollectiveTimeout,
    GroupRetired,
    LedgerError,
    PeerFailed,
    RankguardError,
    TeardownTimeout,
    UsageError,
)
from .runtime.deadline import deadline
from .runtime.generations import Generation, regroup
from .runtime.init import init
from .runtime.shutdown import ShutdownReport, shutdown

__version__ = "0.1.0"
__all__ = [
    "CollectiveError", "CollectiveTimeout", "Generation", "GroupRetired", "LedgerError",
    "PeerFailed", "RankguardError", "ShutdownReport", "TeardownTimeout", "UsageError",
    "__version__", "deadline", "init", "regroup", "shutdown",
]
