"""What the launcher asks of the other nodes of its job: its node link.

The launcher's agent (``agent.Agent``) runs attempts of this node's ranks; everything a run of
several nodes adds goes through one small interface, :class:`NodeLink`, which the launcher
holds. On one node that is :class:`OneNode`, which hosts the job's store and otherwise does
nothing; with several, ``node_agent.MultiNode`` (a round of torch's rendezvous per attempt, the
round's end, the nodes' beats, the other nodes' ranks, standbys).

The launcher gives its link a :class:`LinkContext`: what the link may use of the launcher's own
(its journal, its terminal, its spares, whether it received a signal), and nothing else.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from .. import margins
from ..records.journal import Journal
from ..records.ledger import RankProgress
from ..supervisor import RankProcesses
from . import store as _store
from .config import RunConfig
from .in_place import InPlace
from .interruptible import Interruptible
from .monitor import Verdict
from .outcome import Fault, run_status
from .ranks import Layout
from .spares import Spares
from .watch_rules import Later


@dataclass(frozen=True)
class LinkContext:
    """The launcher's parts a node link may use."""

    config: RunConfig
    journal: Journal
    say: Callable[[str], None]  # a line to the terminal
    signal_received: Callable[[], int | None]  # the signal the launcher received, if any
    wake: Callable[[], None]  # wake the attempt's event loop (from any thread)
    spares: Spares | None
    in_place: InPlace | None


class NodeLink(Protocol):
    """This node's link to the other nodes of its job, one attempt (round) after another.

    The launcher calls, per attempt: :meth:`join`, :meth:`started`, then on each look of its
    loop :meth:`outside_fault`, :meth:`observed`, :meth:`remote_ranks`, :meth:`cause_of`,
    :meth:`leaves_to_others`; once the node's ranks ended or faulted, :meth:`agree_on_end`. After
    the last attempt, :meth:`leave`. None of them raises but where it says so.
    """

    cascade_window: float  # how long a rank's error inside a collective waits for its cause

    def run_fields(self) -> dict[str, Any]:
        """Fields of the ``run_start`` event beyond one node's."""
        ...

    def join(self, attempt: int) -> Layout | Fault:
        """Where this attempt's ranks sit in the job; or the fault that keeps this node from
        taking part (the round did not form, a signal came, the job ended while it stood by)."""
        ...

    def replacing_a_node(self) -> bool:
        """Whether this attempt's ranks take the place of a lost node's."""
        ...

    def started(self, ranks: RankProcesses) -> None:
        """The attempt's ranks have started."""
        ...

    def outside_fault(self, now: float) -> Fault | None:
        """A fault that ended the attempt elsewhere (another node, the store), seen at ``now``."""
        ...

    def observed(self, snaps: dict[int, RankProgress]) -> None:
        """This node's ranks' progress as just read, for the other nodes to hear."""
        ...

    def remote_ranks(self, snaps: dict[int, RankProgress],
                     now: float) -> dict[int, RankProgress]:
        """The job's ranks that are not this node's, as far as it knows their progress, to be
        judged beside its own (``snaps``, read at ``now``)."""
        ...

    def cause_of(self, fault: Fault, now: float) -> Fault | Later:
        """The root cause to act on when the ranks, still watched, show ``fault`` at ``now``
        (it, or what it is an effect of elsewhere), or ``LATER`` to decide on a later look."""
        ...

    def cause_once_ended(self, fault: Fault) -> Fault:
        """:meth:`cause_of` once every rank of this node has exited (nothing more will show
        here): waits for the evidence from the other nodes, within ``--hang-timeout`` of the
        fault."""
        ...

    def leaves_to_others(self, verdict: Verdict) -> bool:
        """Whether ``verdict`` is another node's to make (for now)."""
        ...

    def agree_on_end(self, fault: Fault | None,
               hang: Verdict | None) -> tuple[Fault | None, Verdict | None]:
        """Once this node's ranks have all ended or one faulted (``fault``, ``hang``): tell the
        other nodes, and learn how the attempt ended for the job; returns its fault and hang."""
        ...

    def final(self, fault: Fault) -> bool:
        """Whether no restart can follow ``fault`` because of how the nodes meet."""
        ...

    def run_status(self, fault: Fault | None, signum: int | None) -> tuple[str, int]:
        """How the run ended, from its last attempt's ``fault`` (see ``outcome.run_status``)."""
        ...

    def leave(self, fault: Fault | None) -> None:
        """After the last attempt, which ended with ``fault``: leave the job (bounded)."""
        ...

    def interrupt(self) -> None:
        """A signal came: wake whatever of the link's waits the launcher is in. Called from the
        signal handler: sets events, and raises only inside a call of the link's own that
        ``interruptible`` cuts short (and catches), never in the launcher's code."""
        ...


class OneNode:
    """The node link of a run on one node: the job is this node's; it hosts the job's store on
    ``listen_socket`` (``store.reserve_port``), from the first attempt's start to the end.

    Hosting imports torch on the launcher's main thread (2 s, over 10 s under load) while the
    first attempt's ranks import it too; a signal to the launcher meanwhile cuts it short, so
    that the attempt's loop stops the ranks at once rather than after the import (a signal
    ends the run: no later attempt needs the store)."""

    cascade_window = margins.CASCADE_WINDOW_S

    def __init__(self, config: RunConfig, listen_socket: socket.socket) -> None:
        self._config = config
        self._socket = listen_socket  # the store's once it is hosted
        self.port: int = listen_socket.getsockname()[1]
        self._store: Any = None
        self._hosting = Interruptible()

    def run_fields(self) -> dict[str, Any]:
        return {}

    def join(self, attempt: int) -> Layout | Fault:
        return Layout.one_node(self._config, attempt, self.port)

    def replacing_a_node(self) -> bool:
        return False

    def started(self, ranks: RankProcesses) -> None:
        if self._store is None:  # while the ranks import torch; None if a signal cut it short
            self._store = self._hosting.run(
                lambda: _store.host(self._socket, self._config.master_addr))

    def outside_fault(self, now: float) -> Fault | None:
        return None

    def observed(self, snaps: dict[int, RankProgress]) -> None:
        pass

    def remote_ranks(self, snaps: dict[int, RankProgress],
                     now: float) -> dict[int, RankProgress]:
        return {}

    def cause_of(self, fault: Fault, now: float) -> Fault | Later:
        return fault

    def cause_once_ended(self, fault: Fault) -> Fault:
        return fault

    def leaves_to_others(self, verdict: Verdict) -> bool:
        return False

    def agree_on_end(self, fault: Fault | None,
               hang: Verdict | None) -> tuple[Fault | None, Verdict | None]:
        return fault, hang

    def final(self, fault: Fault) -> bool:
        return False

    def run_status(self, fault: Fault | None, signum: int | None) -> tuple[str, int]:
        return run_status(fault, signum)

    def leave(self, fault: Fault | None) -> None:
        pass

    def interrupt(self) -> None:
        """Cuts the store's first hosting short, if it is under way (``interruptible``)."""
        self._hosting.cut()
