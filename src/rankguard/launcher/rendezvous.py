"""Meeting the other nodes of a run: torch's own dynamic rendezvous, on the c10d or etcd-v2
backend.

Each node runs one agent (``rankguard run --nnodes ...``). The agents meet in rounds of torch's
``DynamicRendezvousHandler`` (``torch.distributed.elastic.rendezvous``), whose state lives in
the job's store through torch's ``C10dRendezvousBackend`` or ``EtcdRendezvousBackend``: the same
handler, backends and round rules as torchrun (min/max nodes, last call, keep-alive
heartbeats), not a protocol of ours.

**The job's store** (:func:`connect`) holds torch's rendezvous state and the job-wide keys (the
agents' count, the rounds' numbers, the job's end).

- ``c10d``: one TCPStore at ``--rdzv-endpoint``, hosted by the agent that can bind that address
  (the first one on the endpoint's machine, or the one given ``--rdzv-conf is_host=1``), bound
  on that address only (``store_server``); the other agents, and every rank of every node, are
  its clients. It also carries every round's traffic (``round_end``, ``node_beats``, the ranks'
  keys). It is the job's single point of failure: when its agent is gone, the others end
  (bounded), see ``round_end``.
- ``etcd-v2``: an etcd server outside the nodes (``etcd_store``). Each round's traffic goes to a
  store hosted by that round's node 0 (``round_store``): losing any node ends a round, not the
  job.
- ``static`` (torchrun's default with several nodes): a fixed number of nodes, each given its
  rank (``--node-rank``); node 0 hosts the job's store at ``--master-addr:--master-port`` (or
  ``--rdzv-endpoint``), as with c10d but without torch's handler: every node takes part in every
  round, so a node lost ends the job.

Each round's keys live under its own prefix (``store_keys.round_namespace``).

**A round** (:meth:`Rendezvous.next_round`): torch's handler admits this node and gives it
its node rank; then the agents agree, through the round's own prefix of the job's store, on
each node's first global rank (a sum of the ``--nproc-per-node`` of the nodes before it, as
torchrun assigns them), on the round's number, drawn by node 0 from a job-wide counter (every
agent and every rank of the round sees the same number, and no two rounds have the same one),
and on the round's store.

Every wait is bounded: joining by ``join_timeout`` (torch's own deadline, then ours for the
agreement), a store request by ``read_timeout``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence, TypeVar

from ..store import sealed, store_server
from ..deadline import Deadline
from ..errors import RendezvousError, UsageError, first_line, shown
from ..store.store_calls import within
from . import early_signals, round_store
from . import store_keys
from .config import RendezvousConfig, endpoint

_NO_SECOND_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# the option that gave the store's address, for messages (static: node 0's, by --master-*)
_ENDPOINT_OPTION = {"c10d": "--rdzv-endpoint", "etcd-v2": "--rdzv-endpoint",
                    "static": "--master-addr/--master-port"}
_ENDPOINT_CONNECT_S = 1.0  # the most one connection attempt to the endpoint may take
_ENDPOINT_RETRY_S = 0.05  # between attempts: an endpoint whose agent is starting is found this soon
_TELL_AFTER_S = 3.0  # an endpoint unreachable this long is told, once per reason
_SPEAKS_FIRST_S = 0.2  # what the endpoint may send unasked within this is not a store's


@dataclass(frozen=True)
class Round:
    """One round of the rendezvous, as this node takes part in it."""

    number: int  # job-wide, from 0; the same on every node
    group_rank: int  # this node's rank among the round's nodes (torch's, sorted node ids)
    group_world: int  # nodes in the round
    base: int  # the global rank of this node's local rank 0
    world: int  # ranks of every node
    store_host: str  # the round's store (the ranks' MASTER_ADDR): the job's, or node 0's
    store_port: int
    store: Any = None  # the round's store, when this node hosts it (etcd-v2, node 0)

    @property
    def store_endpoint(self) -> str:
        return endpoint(self.store_host, self.store_port)


@dataclass(frozen=True)
class JobStore:
    """The job's store (see the module's docstring), as :func:`connect` opened it."""

    store: Any  # a TCPStore (c10d), or ``etcd_store.EtcdJobStore``
    backend: Any  # torch's rendezvous backend on it
    hosting: bool  # this agent hosts it (c10d)
    round_stores: bool  # each round has a store of its own, hosted by its node 0 (etcd-v2)


def assign(nprocs: Sequence[int]) -> list[tuple[int, int]]:
    """For the ranks per node of a round, by node rank: (first global rank, world size) of
    each node, as torchrun assigns them (node after node). Pure."""
    world = sum(nprocs)
    bases, first = [], 0
    for count in nprocs:
        bases.append((first, world))
        first += count
    return bases


def connect(cfg: RendezvousConfig, run_id: str) -> JobStore:
    """The job's store and torch's rendezvous backend on it.

    ``c10d``: hosted here when the endpoint can be bound here (or ``is_host=1``), else a client
    of the agent that hosts it; ``static``: the same, hosted by node 0. ``etcd-v2``: a client of the etcd server. A client waits up to
    ``join_timeout`` for the endpoint to accept connections (its agent may start later).

    Raises:
        UsageError: ``is_host=1`` and the endpoint cannot be bound here; nothing accepted a
            connection at the endpoint within ``join_timeout``, or no store answered there
            (naming the endpoint and the timeout); etcd-v2 without the ``python-etcd`` package.
    """
    if cfg.backend == "etcd-v2":
        return _connect_etcd(cfg, run_id)
    store, hosting = _connect_c10d(cfg)
    if cfg.backend == "static":
        return JobStore(store, None, hosting, False)
    # imported once the endpoint answered: the wait for it looks at the signals, an import
    # cannot (a raise from a handler inside torch's C++ aborts the process)
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend)

    return JobStore(store, C10dRendezvousBackend(store, run_id), hosting, False)


def _connect_etcd(cfg: RendezvousConfig, run_id: str) -> JobStore:
    try:
        from . import etcd_store
    except ImportError as exc:
        if exc.name != "etcd":
            raise
        raise UsageError("--rdzv-backend", "etcd-v2 needs the python-etcd package, which is not "
                         "installed", "pip install 'rankguard[etcd]' (or python-etcd)") from None
    _await_listener(cfg, Deadline.after(cfg.join_timeout))
    backend, store = etcd_store.open_etcd(cfg, run_id)
    return JobStore(store, backend, False, True)


def _connect_c10d(cfg: RendezvousConfig) -> tuple[Any, bool]:
    if cfg.is_host is not False:
        sock = _bind(cfg)
        if sock is not None:
            return store_server.host(sock, cfg.host, cfg.read_timeout), True
    until = Deadline.after(cfg.join_timeout)
    _await_listener(cfg, until)
    _refuse_a_server_that_speaks_first(cfg)
    from torch.distributed import TCPStore

    left = until.wait_time(at_least=_ENDPOINT_CONNECT_S)
    try:
        # torch's client waits for the server's answer to its handshake without a bound: a
        # listener that accepts and says nothing would hold it for good
        store = within(Deadline.after(left + _ENDPOINT_CONNECT_S), f"joining the store at "
                       f"{cfg.endpoint}", lambda: TCPStore(cfg.host, cfg.port, is_master=False,
                                                           timeout=timedelta(seconds=left)),
                       stop_if=_told_once_unanswered(cfg))
    except RuntimeError as exc:  # StoreStalled too
        raise UsageError(_ENDPOINT_OPTION[cfg.backend], f"no store answered at {cfg.endpoint} "
                         f"within join_timeout {cfg.join_timeout} s ({first_line(exc)})",
                         "is something else listening there?") from None
    store.set_timeout(timedelta(seconds=cfg.read_timeout))
    return store, False


def _told_once_unanswered(cfg: RendezvousConfig) -> Callable[[], None]:
    """The ``stop_if`` of the wait for the store's handshake: the signals (``early_signals``),
    and once, after ``_TELL_AFTER_S``, a line saying what the agent waits for (something that
    accepts connections and says nothing may hold it for join_timeout, 600 s by default)."""
    started = time.monotonic()
    told = False

    def look() -> None:
        nonlocal told
        early_signals.check()
        if not told and time.monotonic() - started >= _TELL_AFTER_S:
            told = True
            _say_waiting(cfg, f"the store at {cfg.endpoint}", "answer: it accepts connections "
                         "but has not answered torch's handshake", "waiting")
    return look


def _say_waiting(cfg: RendezvousConfig, what: str, why: str, how: str) -> None:
    """The line of an agent waiting for its endpoint (told once per reason, ``_TELL_AFTER_S``)."""
    print(f"rankguard: waiting for {what} ({_ENDPOINT_OPTION[cfg.backend]}) to {why}; {how} "
          f"until join_timeout {cfg.join_timeout} s", file=sys.stderr, flush=True)


def _bind(cfg: RendezvousConfig) -> socket.socket | None:
    """The endpoint bound and listening here, or None where it is not this machine's address
    or another process (another agent on this machine) has it."""
    try:
        option = _ENDPOINT_OPTION[cfg.backend]
        return store_server.reserve_port(cfg.host, cfg.port, addr_option=option,
                                         port_option=option, any_port=False)
    except UsageError:
        if cfg.is_host:
            raise
        return None


def _await_listener(cfg: RendezvousConfig, until: Deadline) -> None:
    """Return once something accepts a TCP connection at the endpoint; raise UsageError if
    nothing did before ``until``. Plain sockets, so that an endpoint that is not up yet costs
    no torch retries (and no C++ warnings). Each reason the endpoint cannot be reached is told
    once on stderr after ``_TELL_AFTER_S`` of waiting (a name that does not resolve, a refused
    connection), as it may be a typo rather than a node that is still starting."""
    last = "no attempt"
    told: set[str] = set()
    started = time.monotonic()
    while True:
        try:
            with socket.create_connection(
                    (cfg.host, cfg.port),
                    timeout=until.wait_time(_ENDPOINT_CONNECT_S, at_least=0.001)):
                return
        except OSError as exc:
            last = _unreachable_because(exc)
        if last not in told and time.monotonic() - started >= _TELL_AFTER_S:
            told.add(last)
            _say_waiting(cfg, cfg.endpoint, f"accept connections: {last}", "retrying")
        early_signals.check()
        if until.passed():
            raise UsageError(_ENDPOINT_OPTION[cfg.backend], f"nothing answered at "
                             f"{cfg.endpoint} within join_timeout {cfg.join_timeout} s (last: "
                             f"{last})", "start the agent of the endpoint's node (or the etcd "
                             "server), check the address, or raise --rdzv-conf join_timeout")
        # the pace of connection attempts: nothing signals that a remote port opened
        time.sleep(until.wait_time(_ENDPOINT_RETRY_S))


def _refuse_a_server_that_speaks_first(cfg: RendezvousConfig) -> None:
    """Raise UsageError if what listens at the endpoint sends something before it is asked (an
    SSH server's banner: a port given by mistake). A torch store never speaks first, and torch's
    client would retry such a server until join_timeout, printing a C++ stack each time."""
    try:
        with socket.create_connection((cfg.host, cfg.port), timeout=_ENDPOINT_CONNECT_S) as conn:
            conn.settimeout(_SPEAKS_FIRST_S)
            said = conn.recv(64)
    except OSError:  # silent (a store), or closed: torch's client tells, within join_timeout
        return
    if said:
        raise UsageError(_ENDPOINT_OPTION[cfg.backend], f"what listens at {cfg.endpoint} is not "
                         f"a torch store: it spoke first ({shown(said)})",
                         "give the address and port of the job's store (node 0's)")


def _unreachable_because(exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return f"the name does not resolve: {exc.strerror}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused, nothing listens there yet"
    return exc.strerror or type(exc).__name__



_NPROC_KEY = "rankguard/nproc/{}"  # in the round's own prefix: a node's ranks
_PLAN_KEY = "rankguard/plan"
_REFUSED = "refused"  # node 0's plan when it cannot make one (unsealed: every node reads it)
_MISSING = "missing"  # node 0's plan when a node of the round never gave its ranks (unsealed)
# A node of a round torch formed sees it formed within one poll of torch's join (1 s) of the
# first node that saw it, and gives its ranks at once: one that has not, a poll after
# --hang-timeout, is gone or frozen, as a node whose beat does not change
_RDZV_POLL_S = 1.0
T = TypeVar("T")


@dataclass(frozen=True)
class _Plan:
    """What node 0 decides for a round: its number, each node's ranks, the round's store
    (None: the job's)."""

    number: int
    counts: list[int]
    store: tuple[str, int] | None

    def encode(self) -> str:
        return json.dumps({"round": self.number, "nproc": self.counts,
                           "store": list(self.store) if self.store else None})

    @classmethod
    def decode(cls, payload: str) -> "_Plan":
        """The plan in ``payload``. Pure.

        Raises:
            ValueError, TypeError, KeyError: it is not a plan.
        """
        fields = json.loads(payload)
        counts = [int(count) for count in fields["nproc"]]
        if any(count < 1 for count in counts):
            raise ValueError(f"node ranks {counts}")
        store = fields.get("store")
        where = (str(store[0]), int(store[1])) if store else None
        return cls(int(fields["round"]), counts, where)


def _absent(store: Any, nodes: int) -> list[int]:
    """The node ranks of a round that never gave their ranks (empty when that cannot be told:
    the store failed)."""
    try:
        return [node for node in range(nodes) if not store.check([_NPROC_KEY.format(node)])]
    except RuntimeError:
        return []


def _uneven(counts: list[int]) -> str:
    """Why a round whose nodes have different numbers of ranks is refused. Pure."""
    listed = ", ".join(f"node {node}: {count}" for node, count in enumerate(counts))
    return (f"the nodes give different --nproc-per-node ({listed}): give every node the "
            "same --nproc-per-node")


class NodesMissing(RendezvousError):
    """Nodes of a round that torch's rendezvous formed never gave their ranks: they died or
    froze as it formed. The round is lost, not the job: the next one forms without them."""


# how node 0's unsealed plan ends a round: (its first word, the error, what the others say)
_PLAN_ENDS = ((_REFUSED, RendezvousError, "node 0 of the round refused it: "),
              (_MISSING, NodesMissing, ""))


class RendezvousClosed(RendezvousError):
    """The rendezvous was closed: the job ended (or another node ended it) while this agent
    waited for a round."""


# torch's keep-alive defaults (5 s, 3 missed) keep a lost node in the round's participants for
# 15 s, and the next round forms only once it is dropped; ours drop it within about 3 s.
KEEP_ALIVE_DEFAULTS = {"keep_alive_interval": "1", "keep_alive_max_attempt": "3"}


class Rendezvous:
    """This node's side of the job's rendezvous (one per agent, for every round)."""

    def __init__(self, cfg: RendezvousConfig, run_id: str, job: JobStore,
                 quiet_s: float) -> None:
        """``quiet_s``: how long a node of a formed round may be silent (``--hang-timeout``)."""
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

        self._cfg = cfg
        self._run_id = run_id
        self._job = job
        self._store = job.store
        self._quiet_s = quiet_s
        self._hosted: list[Any] = []  # the round stores this node hosts: the last two
        self._handler: Any = None  # torch's; None: static (the nodes are given their ranks)
        self._static_rounds = 0  # static: the rounds this node took part in
        if cfg.backend == "static":
            return
        # torch's handler would otherwise start a second TCPStore on node 0 for the ranks,
        # listening on every interface; the ranks use the job's store (MASTER_ADDR/PORT are the
        # endpoint), so it would serve no one. Read by the handler at each round.
        os.environ[_NO_SECOND_STORE] = "1"
        params = RendezvousParameters(
            cfg.backend, cfg.endpoint, run_id, cfg.min_nodes, cfg.max_nodes, cfg.local_addr,
            join_timeout=str(cfg.join_timeout), last_call_timeout=str(cfg.last_call_timeout),
            close_timeout=str(cfg.close_timeout), **{**KEEP_ALIVE_DEFAULTS, **dict(cfg.extra)})
        self._handler = create_handler(job.store, job.backend, params)

    def next_round(self, nproc: int) -> Round:
        """Join the next round with ``nproc`` local ranks; returns it once every node of it
        has agreed on the ranks. Bounded by ``join_timeout`` for torch's join, then by twice
        ``quiet_s`` (and a poll of torch's) for the agreement: every node of a formed round is
        there already, unless it died or froze as the round formed.

        Raises:
            NodesMissing: a node of the round torch formed never gave its ranks.
            RendezvousError: the round did not form in time, the rendezvous was closed, or
                the job's store failed; naming the endpoint and the timeout.
        """
        from torch.distributed.elastic.rendezvous import (RendezvousClosedError,
                                                          RendezvousConnectionError,
                                                          RendezvousGracefulExitError)
        from torch.distributed.elastic.rendezvous import RendezvousError as TorchRdzvError

        cfg = self._cfg
        if self._handler is None:
            return self._next_static_round(nproc)
        try:
            info = self._handler.next_rendezvous()
        except RendezvousConnectionError:
            where = (f"the etcd server at {cfg.endpoint} did not answer" if
                     self._job.round_stores else f"lost the job's store at {cfg.endpoint} "
                     "(its node's agent is gone?)")
            raise RendezvousError(cfg.endpoint, f"{where} while joining a round") from None
        except (RendezvousClosedError, RendezvousGracefulExitError):
            raise RendezvousClosed(cfg.endpoint, f"the rendezvous at {cfg.endpoint} was "
                                   "closed: another node ended the job") from None
        except (TorchRdzvError, RuntimeError) as exc:
            why = first_line(exc)
            why = type(exc).__name__ if why == type(exc).__name__ else \
                f"{type(exc).__name__}: {why}"
            raise RendezvousError(cfg.endpoint, f"no rendezvous round of {cfg.nodes_wanted} "
                                  f"nodes formed at {cfg.endpoint} within join_timeout "
                                  f"{cfg.join_timeout} s ({why})", cfg.join_timeout) from None
        quiet = timedelta(seconds=min(self._quiet_s + _RDZV_POLL_S, cfg.join_timeout))
        return self._agreed(info.store, info.rank, info.world_size, nproc, quiet)

    def _next_static_round(self, nproc: int) -> Round:
        """A static round: every node of the job, each with its given rank, meets under the
        round's own prefix of the job's store. Every node takes part in every round (a fault
        anywhere ends the round everywhere), so their counts of rounds agree."""
        from torch.distributed import PrefixStore

        cfg = self._cfg
        assert cfg.node_rank is not None
        prefix = store_keys.static_namespace(self._run_id, self._static_rounds)
        self._static_rounds += 1
        store = PrefixStore(prefix, self._store)
        try:
            claims = store.add(store_keys.node_claim_key(cfg.node_rank), 1)
        except RuntimeError as exc:
            raise RendezvousError(cfg.endpoint, f"lost the job's store at {cfg.endpoint}: "
                                  f"{first_line(exc)}") from None
        if claims > 1:
            raise RendezvousError(cfg.endpoint, f"another agent of this job has --node-rank "
                                  f"{cfg.node_rank}: give each node its own rank, from 0 to "
                                  f"{cfg.max_nodes - 1}")
        return self._agreed(store, cfg.node_rank, cfg.max_nodes, nproc, None)

    def _agreed(self, store: Any, group_rank: int, group_world: int, nproc: int,
                quiet: timedelta | None) -> Round:
        """:meth:`_agree`, its store's failures as a RendezvousError (``NodesMissing`` when
        nodes of a formed round, ``quiet`` given, never gave their ranks)."""
        cfg = self._cfg
        try:
            return self._agree(store, group_rank, group_world, nproc, quiet)
        except RuntimeError as exc:  # torch's DistStoreError / DistNetworkError
            absent = _absent(store, group_world)
            if absent and quiet is not None:
                raise self._missing(absent, group_world, quiet) from None
            why = (f"node(s) {', '.join(map(str, absent))} never came" if absent else
                   f"the store said: {first_line(exc)}")
            raise RendezvousError(cfg.endpoint, f"the {group_world} nodes of the round did not "
                                  f"agree on their ranks at {cfg.endpoint} within join_timeout "
                                  f"{cfg.join_timeout} s: {why}", cfg.join_timeout) from None

    def _missing(self, absent: list[int], group_world: int, quiet: timedelta) -> NodesMissing:
        nodes = ", ".join(map(str, absent))
        return NodesMissing(self._cfg.endpoint, f"node(s) {nodes} of the round of {group_world} "
                            f"nodes never gave their ranks, {quiet.total_seconds():g} s after "
                            "torch's rendezvous formed it: gone or frozen as it formed",
                            quiet.total_seconds())

    def _agree(self, store: Any, group_rank: int, group_world: int, nproc: int,
               quiet: timedelta | None) -> Round:
        """Through the round's own prefix of the store (``store``, torch's): every node's
        ``nproc`` in, node 0 writes the plan (round number, bases, and with etcd-v2 the round's
        store, which it hosts), every node reads it. Each value is sealed with the job's secret
        when the nodes share one (see ``sealed``). ``quiet``: how long node 0 waits for the
        others' ranks (the others wait twice as long for its plan); None: ``join_timeout``
        (static nodes, which come at their own pace).

        Raises:
            NodesMissing: (node 0) a node never gave its ranks within ``quiet``; the others
                read that in its plan.
            RendezvousError: a value is not one of this job's (no seal, or not readable).
        """
        limit = quiet or timedelta(seconds=self._cfg.join_timeout)
        mine = _NPROC_KEY.format(group_rank)
        store.set(mine, sealed.seal(mine, str(nproc)))
        if group_rank == 0:
            keys = [_NPROC_KEY.format(node) for node in range(group_world)]
            try:
                store.wait(keys, limit)
            except RuntimeError:
                absent = _absent(store, group_world)
                if not absent or quiet is None:
                    raise
                missing = self._missing(absent, group_world, quiet)
                store.set(_PLAN_KEY, f"{_MISSING}: {missing}")  # the others stop at it too
                raise missing from None
            try:
                counts = [self._open(key, value, int) for key, value in
                          zip(keys, store.multi_get(keys))]
                if len(set(counts)) > 1:
                    raise RendezvousError(self._cfg.endpoint, _uneven(counts))
                where = self._host_round_store() if self._job.round_stores else None
            except RendezvousError as exc:
                # the others stop at it, not at join_timeout
                store.set(_PLAN_KEY, f"{_REFUSED}: {exc}")
                raise
            number = self._store.add(store_keys.rounds_key(self._run_id), 1) - 1
            store.set(_PLAN_KEY, sealed.seal(_PLAN_KEY, _Plan(number, counts, where).encode()))
        store.wait([_PLAN_KEY], 2 * limit if quiet else limit)
        plan = self._open(_PLAN_KEY, store.get(_PLAN_KEY), _Plan.decode)
        if len(plan.counts) != group_world:
            # torch drops a node that died as the round formed from the round's participants,
            # and the nodes that read them after that count one fewer (its own plan is sealed)
            raise NodesMissing(self._cfg.endpoint, f"node 0 counted {len(plan.counts)} nodes in "
                               f"the round, this node {group_world}: a node was lost as torch's "
                               "rendezvous formed it")
        if (plan.store is None) == self._job.round_stores:
            raise self._foreign(_PLAN_KEY, "another backend's plan")
        base, world = assign(plan.counts)[group_rank]
        host, port = plan.store or (self._cfg.host, self._cfg.port)
        hosted = self._hosted[-1] if group_rank == 0 and plan.store else None
        return Round(plan.number, group_rank, group_world, base, world, host, port, hosted)

    def _host_round_store(self) -> tuple[str, int]:
        """Host the next round's store here; keep the previous one until that round formed
        (a node may still read the previous round's end from it)."""
        try:
            store, host, port = round_store.host_round_store(self._cfg)
        except UsageError as exc:
            raise RendezvousError(self._cfg.endpoint, f"this node (node 0 of the round) cannot "
                                  f"host the round's store: {exc}") from None
        self._hosted = self._hosted[-1:] + [store]
        return host, port

    def _open(self, key: str, value: bytes, parse: Callable[[str], T]) -> T:
        for word, error, said in _PLAN_ENDS:
            if value.startswith(word.encode()):
                # unsealed (a secret mismatch may be why): shown as text, acted on no further
                # than ending this round (a forged "missing" costs a round, as a lost node)
                why = value[len(word) + 2:].decode(errors="replace")[:300]
                why = "".join(c if c.isprintable() else "?" for c in why)
                raise error(self._cfg.endpoint, f"{said}{why}")
        payload = sealed.unseal(key, value)
        if payload is None:
            raise self._foreign(key, "without this job's seal")
        try:
            return parse(payload)
        except (ValueError, TypeError, KeyError) as exc:
            raise self._foreign(key, f"unreadable: {exc}") from None

    def _foreign(self, key: str, why: str) -> RendezvousError:
        return RendezvousError(self._cfg.endpoint, f"the round's {key!r} in the store at "
                               f"{self._cfg.endpoint} is not a value of this job ({why}): the "
                               "nodes must share RANKGUARD_SECRET (set it alike on every "
                               "node, or on none), and nothing else may write to the store")

    def record_end(self, status: str, code: int) -> None:
        """Say in the store how the job ended (the first node to say it stands), for the
        standby nodes, which never took part in a round. Never raises."""
        value = sealed.seal(self._end_key, json.dumps({"status": status, "code": code}))
        try:
            self._store.compare_set(self._end_key, "", value)
        except RuntimeError:
            pass  # the store is gone: a standby then learns the end from the closed rendezvous

    def recorded_end(self) -> tuple[str, int] | None:
        """How the job ended, as the first node to end said it; None if none did (or it is
        not a record of ours: no seal, unreadable)."""
        try:
            if not self._store.check([self._end_key]):
                return None
            payload = sealed.unseal(self._end_key, self._store.get(self._end_key))
            if payload is None:
                return None
            fields = json.loads(payload)
            return str(fields["status"]), int(fields["code"])
        except (RuntimeError, ValueError, TypeError, KeyError):
            return None

    @property
    def _end_key(self) -> str:
        return store_keys.job_end_key(self._run_id)

    def shutdown(self) -> None:
        """Close the rendezvous (torch's ``shutdown``: no later round forms; bounded by
        ``close_timeout``); stop this node's keep-alive heartbeats. Never raises."""
        if self._handler is None:
            return  # static: no standby waits for a round
        try:
            self._handler.shutdown()
        except Exception:  # noqa: BLE001 (the store may be gone already: nothing to close)
            pass
