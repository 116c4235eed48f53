"""The validated settings of one ``rankguard run``."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import margins, sealed
from ..inject.spec import FaultSpec

DEFAULT_HANG_TIMEOUT = 10.0
DEFAULT_STRAGGLER_TIMEOUT = 300.0
DEFAULT_GRACE = 5.0
DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class RunConfig:
    """Everything the launcher needs; built by ``launcher.cli.parse`` from the command line.

    Times are seconds. ``master_port`` 0 means any free port.
    """

    command: tuple[str, ...]  # (script, *args) or ("-m", module, *args)
    nproc: int
    max_restarts: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT
    run_id: str = ""
    log_dir: str = ""
    journal_path: str = ""
    hang_timeout: float = DEFAULT_HANG_TIMEOUT
    straggler_timeout: float = DEFAULT_STRAGGLER_TIMEOUT
    grace: float = DEFAULT_GRACE
    injections: tuple[FaultSpec, ...] = field(default_factory=tuple)
    tee: bool = True  # copy rank output to the launcher's stdout/stderr, prefixed [rankN]:
    spares: bool = True  # keep warm spares for restarts (only when --max-restarts > 0)
    collective_timeout: float | None = None  # job-wide deadline of every collective
    secret: str = field(default_factory=sealed.new_secret, repr=False)  # the ranks' store seal

    @property
    def rank_grace(self) -> float:
        """The SIGTERM teardown budget of a rank: inside ``grace``, so it ends before SIGKILL
        (see ``margins.rank_grace``)."""
        return margins.rank_grace(self.grace)

    @property
    def description(self) -> str:
        return " ".join(self.command)
