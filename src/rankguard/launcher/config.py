"""The validated settings of one ``rankguard run``."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from .. import margins
from ..store import sealed
from ..inject.spec import FaultSpec
from .streams import TerminalStreams

DEFAULT_HANG_TIMEOUT = 10.0
DEFAULT_STRAGGLER_TIMEOUT = 300.0
DEFAULT_GRACE = 5.0
DEFAULT_MASTER_PORT = 29500
RESTART, IN_PLACE = "restart", "in-place"  # --recovery
DEFAULT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")  # torchrun's --signals-to-handle
# torch's own defaults for the dynamic rendezvous (torch.distributed.elastic.rendezvous)
DEFAULT_JOIN_TIMEOUT = 600
DEFAULT_LAST_CALL_TIMEOUT = 30
DEFAULT_CLOSE_TIMEOUT = 30
DEFAULT_READ_TIMEOUT = 60


@dataclass(frozen=True)
class RendezvousConfig:
    """How the agents of a multi-node run meet: torch's dynamic rendezvous on the c10d or
    etcd-v2 backend, or a static rendezvous (fixed nodes, each given its rank).

    Times are whole seconds, as torch's rendezvous takes them (``--rdzv-conf``).
    """

    min_nodes: int
    max_nodes: int
    host: str  # of --rdzv-endpoint: where the job's store is (hosted by the agent there)
    port: int
    backend: str = "c10d"
    join_timeout: int = DEFAULT_JOIN_TIMEOUT  # bounds joining a round, and every wait on peers
    last_call_timeout: int = DEFAULT_LAST_CALL_TIMEOUT
    close_timeout: int = DEFAULT_CLOSE_TIMEOUT  # bounds the end: closing, the last agents leaving
    read_timeout: int = DEFAULT_READ_TIMEOUT  # bounds one store request
    is_host: bool | None = None  # host the store here (None: when the endpoint can be bound here)
    local_addr: str | None = None  # this node's address in the rendezvous (torch: its FQDN)
    extra: tuple[tuple[str, str], ...] = ()  # other --rdzv-conf keys, passed on to torch
    node_rank: int | None = None  # static: this node's rank (the others number nodes themselves)

    @property
    def endpoint(self) -> str:
        return endpoint(self.host, self.port)

    @property
    def nodes_wanted(self) -> str:
        """``--nnodes`` for messages: ``2``, or ``1 to 3`` for an elastic job."""
        return (f"{self.min_nodes}" if self.min_nodes == self.max_nodes
                else f"{self.min_nodes} to {self.max_nodes}")

    @property
    def next_round_wait(self) -> str:
        """What a round after the first waits for, with its true bound, for the line an agent
        prints before it joins: a fixed ``--nnodes N`` waits for N nodes up to
        ``join_timeout``; ``MIN:MAX`` forms ``last_call_timeout`` after MIN nodes have joined
        (at once with MAX), and waits up to ``join_timeout`` only while fewer than MIN have."""
        if self.min_nodes == self.max_nodes:
            return (f"the next round waits for {self.min_nodes} nodes (--nnodes) to join, up to "
                    f"join_timeout {self.join_timeout} s (--rdzv-conf join_timeout=SECONDS)")
        return (f"the next round waits for {self.nodes_wanted} nodes (--nnodes): it forms when "
                f"{self.max_nodes} have joined, or last_call_timeout {self.last_call_timeout} s "
                f"after {self.min_nodes} have (--rdzv-conf last_call_timeout=SECONDS); with "
                f"fewer it waits up to join_timeout {self.join_timeout} s")


def endpoint(host: str, port: int) -> str:
    """``HOST:PORT`` (``[IPv6]:PORT``), for messages. Pure."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
    # the folders made for the logs and the journal, outermost first (options.missing_dirs): a
    # run that ends before starting anything removes them again while they are empty
    made_dirs: tuple[str, ...] = ()
    hang_timeout: float = DEFAULT_HANG_TIMEOUT
    straggler_timeout: float = DEFAULT_STRAGGLER_TIMEOUT
    grace: float = DEFAULT_GRACE
    injections: tuple[FaultSpec, ...] = field(default_factory=tuple)
    streams: TerminalStreams = TerminalStreams()  # what of which local ranks' output the
    # launcher's stdout/stderr show, prefixed [rankN]: (all of it by default)
    no_python: bool = False  # command[0] is an executable, run without python (--no-python)
    role: str = "default"  # ROLE_NAME
    virtual_local_rank: bool = False  # LOCAL_RANK 0, CUDA_VISIBLE_DEVICES its own device
    signals: tuple[signal.Signals, ...] = tuple(signal.Signals[name] for name in DEFAULT_SIGNALS)
    notes: tuple[str, ...] = ()  # lines for stderr, once: options given that have no effect
    spares: bool = True  # keep warm spares for restarts (only when --max-restarts > 0)
    collective_timeout: float | None = None  # job-wide deadline of every collective
    secret: str = field(default_factory=sealed.new_secret, repr=False)  # the ranks' store seal
    rendezvous: RendezvousConfig | None = None  # several nodes; None: this node alone
    recovery: str = "restart"  # or "in-place": a failed rank is replaced, the others go on

    @property
    def in_place(self) -> bool:
        return self.recovery == IN_PLACE

    @property
    def rank_grace(self) -> float:
        """The SIGTERM teardown budget of a rank: inside ``grace``, so it ends before SIGKILL
        (see ``margins.rank_grace``)."""
        return margins.rank_grace(self.grace)

    @property
    def description(self) -> str:
        return " ".join(self.command)
