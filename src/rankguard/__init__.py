"""rankguard: distributed PyTorch jobs, servers and test suites that never hang.

``rankguard run`` launches a job (see ``rankguard.launcher``); the rank runtime lives in
``rankguard.runtime``; fault injection in ``rankguard.inject``.
"""

from .errors import LedgerError, RankguardError, UsageError

__version__ = "0.1.0"
__all__ = ["LedgerError", "RankguardError", "UsageError", "__version__"]
