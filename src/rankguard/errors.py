"""The exception hierarchy of rankguard.

Every error that rankguard raises on purpose derives from :class:`RankguardError`, so a caller
can catch them all in one place. Each class carries machine-readable fields beside a message a
person understands.

    RankguardError
    ├── UsageError          bad command-line flags, config, environment or fault spec
    └── LedgerError         a progress ledger file that is missing, foreign or corrupt
"""

from __future__ import annotations


class RankguardError(Exception):
    """Base class of every error rankguard raises on purpose."""


class UsageError(RankguardError):
    """Bad input from the user: a flag, a value, a path, a fault spec.

    Attributes:
        what: the flag or field that is wrong (e.g. ``--nproc-per-node``).
        hint: how to fix it, in one sentence.
    """

    def __init__(self, what: str, problem: str, hint: str = "") -> None:
        self.what = what
        self.problem = problem
        self.hint = hint
        text = f"{what}: {problem}"
        if hint:
            text += f" ({hint})"
        super().__init__(text)


class LedgerError(RankguardError):
    """A progress ledger that cannot be used (wrong size, wrong magic number, missing file)."""
