"""The metrics of ``rankguard serve``, exposed with the Prometheus client library.

``prometheus_client`` writes the exposition format (escaping, ``_total``/``_bucket`` suffixes,
``# HELP``/``# TYPE``) and keeps the request-latency histogram; the pool's own counts are read
at scrape time by a collector, so a scrape always agrees with ``Pool.metrics()``. Each server has
a registry of its own (never the library's global one): two servers in one process, or a test,
never mix their figures.

The names are stable (the README lists them):

- ``rankguard_request_seconds{outcome}``: histogram, seconds from a request reaching the pool
  to its answer (``ok``, ``failed``, ``unavailable``, ``closed``);
- ``rankguard_pool_requests_total{outcome}``, ``rankguard_pool_faults_total{cause}``,
  ``rankguard_pool_heals_total``, ``rankguard_pool_start_failures_total``: counters;
- ``rankguard_pool_heal_seconds``: histogram, from losing the serving replica to a new one
  serving;
- ``rankguard_pool_suspicions_total``: counter, calls that ran past ``suspect_after`` while
  others waited (their replica was drained);
- ``rankguard_pool_heal_actions_total{action}`` (what a fault's replica went through:
  ``serving.heal_plan.Heal``), ``rankguard_pool_ranks_replaced_total`` (rank processes
  replaced while their peers kept theirs): counters;
- ``rankguard_pool_spares_ready``, ``rankguard_pool_spares_starting``,
  ``rankguard_pool_idle``, ``rankguard_pool_waiting`` (calls waiting for a replica),
  ``rankguard_pool_replicas{state}`` (``idle``, ``serving``, ``suspect``, ``spare``,
  ``starting``, ``healing``), ``rankguard_pool_state{state}``,
  ``rankguard_pool_rank_device{group,rank,device}`` (1 for each rank of each healthy replica),
  ``rankguard_pool_warm_spares{device}`` (warm spare ranks ready): gauges;
- ``rankguard_http_responses_total{route,code}``, ``rankguard_http_client_disconnects_total``:
  counters; ``rankguard_http_inflight_body_bytes``: gauge, the bytes of request bodies held
  now (at most ``--max-inflight-bytes``); ``rankguard_http_connections_refused_total`` (503
  ``TooManyConnections``), ``rankguard_http_idle_connections_closed_total`` (closed to make
  room), both by ``--max-connections``: counters.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)

from ..errors import RequestCause
from .heal_plan import Heal
from .head_deadline import Turned
from .heal_times import HealTimes
from .pool import Pool
from .pool_state import PoolState, PoolStatus

CONTENT_TYPE = CONTENT_TYPE_LATEST
CAUSES = tuple(RequestCause)
STATES = tuple(PoolState)
HEAL_ACTIONS = tuple(Heal)
REPLICA_STATES = ("idle", "serving", "suspect", "spare", "starting", "healing")


class CallOutcome(enum.StrEnum):
    """How a call ended (the ``outcome`` label of ``rankguard_request_seconds`` and of
    ``rankguard_pool_requests``, and the pool's ``requests_*`` counts)."""

    OK = "ok"  # its result
    FAILED = "failed"  # RequestFailed
    UNAVAILABLE = "unavailable"  # PoolUnavailable
    CLOSED = "closed"  # PoolClosed (before it started, or cut by the pool's close)
    ABANDONED = "abandoned"  # given up while it waited, its client gone
    # serve's only: the ranks refused the request's body (its service's validate, or JSON they
    # could not parse), answered 4xx; a call that ended well to the pool, which counts it ok
    REFUSED = "refused"


OUTCOMES = tuple(CallOutcome)
POOL_OUTCOMES = tuple(outcome for outcome in CallOutcome if outcome != CallOutcome.REFUSED)
# seconds: a request is answered within its timeout (at most minutes)
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0)


class ServeMetrics:
    """One server's metrics: ``observe_request`` as requests end, ``exposition()`` per scrape.

    Args:
        pool: the server's pool (None until its lifespan started it).
        codes: responses by (route, status code), as the server counts them.
        disconnects: how many clients left before they sent the whole body.
        body_bytes: the bytes of request bodies the server holds now.
        connections: what the cap on connections did (``head_deadline.Turned``).
    """

    def __init__(self, pool: Callable[[], Pool | None],
                 codes: Callable[[], Mapping[tuple[str, int], int]],
                 disconnects: Callable[[], int], body_bytes: Callable[[], int],
                 connections: Turned) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._requests = Histogram("rankguard_request_seconds", "Seconds from a request "
                                   "reaching the pool to its answer, by outcome.", ["outcome"],
                                   buckets=REQUEST_BUCKETS, registry=self.registry)
        for outcome in OUTCOMES:
            self._requests.labels(outcome)  # every outcome shown from the start, at 0
        self.registry.register(_PoolCollector(pool, codes, disconnects, body_bytes,
                                              connections))

    def observe_request(self, outcome: CallOutcome, seconds: float) -> None:
        self._requests.labels(outcome).observe(seconds)

    def exposition(self) -> bytes:
        """The text a Prometheus scrape of ``/metrics`` gets."""
        return generate_latest(self.registry)


class _PoolCollector:
    """The pool's counts and the HTTP counts, read at each scrape."""

    def __init__(self, pool: Callable[[], Pool | None],
                 codes: Callable[[], Mapping[tuple[str, int], int]],
                 disconnects: Callable[[], int], body_bytes: Callable[[], int],
                 connections: Turned) -> None:
        self._pool = pool
        self._codes = codes
        self._disconnects = disconnects
        self._body_bytes = body_bytes
        self._connections = connections

    def collect(self) -> Iterator[Metric]:
        pool = self._pool()
        values: Mapping[str, Any] = pool.metrics() if pool is not None else {}
        status = pool.status() if pool is not None else None
        yield _counter("rankguard_pool_requests", "Pool calls by outcome.", "outcome",
                       {o: values.get(f"requests_{o}", 0) for o in POOL_OUTCOMES})
        yield _counter("rankguard_pool_faults", "Failed calls by the cause of the fault.",
                       "cause", {c: values.get(f"faults_{c}", 0) for c in CAUSES})
        yield _counter("rankguard_pool_heals", "Times a new replica took over after the "
                       "serving one was lost.", None, {"": values.get("heals", 0)})
        yield _heal_histogram(pool.heal_buckets() if pool is not None else HealTimes().buckets(),
                              values.get("heal_seconds_sum", 0.0))
        yield _counter("rankguard_pool_heal_actions", "What the pool did with a replica after a "
                       "failed call: regroup, drain_then_regroup, replace (its unusable ranks), "
                       "stacks_then_replace, stacks_then_kill, kill.", "action",
                       {a: values.get(f"heal_{a}", 0) for a in HEAL_ACTIONS})
        yield _counter("rankguard_pool_ranks_replaced", "Rank processes replaced by new ones "
                       "while their replica's other ranks kept theirs.", None,
                       {"": values.get("ranks_replaced", 0)})
        yield _counter("rankguard_pool_start_failures", "Replica start-ups that failed.", None,
                       {"": values.get("start_failures", 0)})
        yield _gauge("rankguard_pool_spares_ready", "Spare replicas ready to take over.",
                     status.spares_ready if status else 0)
        yield _gauge("rankguard_pool_spares_starting", "Replicas starting.",
                     status.spares_starting if status else 0)
        yield _counter("rankguard_pool_suspicions", "Calls that ran past suspect_after while "
                       "others waited (their replica was drained).", None,
                       {"": values.get("suspicions", 0)})
        yield _gauge("rankguard_pool_idle", "Replicas that can take a request now.",
                     status.idle if status else 0)
        yield _gauge("rankguard_pool_waiting", "Calls waiting for a replica.",
                     status.waiting if status else 0)
        replicas = GaugeMetricFamily("rankguard_pool_replicas", "Replicas by state: idle (can "
                                     "take a call now), serving (running a call), suspect "
                                     "(running one past suspect_after, drained), spare (ready "
                                     "beyond the serving ones), starting, healing (retired "
                                     "after a fault, regrouping or having ranks replaced).",
                                     labels=["state"])
        for name, count in _replica_states(status).items():
            replicas.add_metric([name], count)
        yield replicas
        state = GaugeMetricFamily("rankguard_pool_state", "The pool's state (1 for the "
                                  "current one).", labels=["state"])
        current = status.state if status else "starting"
        for name in STATES:
            state.add_metric([name], int(current == name))
        yield state
        warm = GaugeMetricFamily("rankguard_pool_warm_spares", "Warm spare ranks ready to "
                                 "take an unusable rank's place, by device.", labels=["device"])
        for device, ready in sorted((status.warm_spares if status else {}).items()):
            warm.add_metric([device], ready)
        yield warm
        placed = GaugeMetricFamily("rankguard_pool_rank_device", "Where each rank of each "
                                   "healthy replica runs (1 per rank): its group, rank and "
                                   "device (cpu, cuda:0).", labels=["group", "rank", "device"])
        for group, devices in sorted((status.placement if status else {}).items()):
            for rank, device in enumerate(devices):
                placed.add_metric([str(group), str(rank), device], 1)
        yield placed
        responses = CounterMetricFamily("rankguard_http_responses", "HTTP responses by route "
                                        "and status code.", labels=["route", "code"])
        for (route, code), count in sorted(self._codes().items()):
            responses.add_metric([route, str(code)], count)
        yield responses
        yield _counter("rankguard_http_client_disconnects", "Requests whose client closed the "
                       "connection before its answer: mid-body, or while the request waited "
                       "or ran (not answered).", None,
                       {"": self._disconnects()})
        yield _gauge("rankguard_http_inflight_body_bytes", "Bytes of request bodies held now "
                     "(being read, or of requests not yet answered); at most "
                     "--max-inflight-bytes.", self._body_bytes())
        yield _counter("rankguard_http_connections_refused", "Connections answered 503 "
                       "TooManyConnections at once and closed: every connection the server "
                       "keeps open (--max-connections) had a request in flight.", None,
                       {"": self._connections.refused})
        yield _counter("rankguard_http_idle_connections_closed", "Connections that had sent no "
                       "request, closed to make room for a new one (--max-connections).", None,
                       {"": self._connections.dropped})


def _replica_states(status: PoolStatus | None) -> dict[str, int]:
    if status is None:
        return dict.fromkeys(REPLICA_STATES, 0)
    return {"idle": status.idle, "serving": status.serving - status.suspect,
            "suspect": status.suspect, "spare": status.spares_ready,
            "starting": status.spares_starting, "healing": status.healing}


def _counter(name: str, text: str, label: str | None,
             values: Mapping[str, float]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, text, labels=[label] if label else None)
    for value_label, value in values.items():
        family.add_metric([value_label] if label else [], value)
    return family


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


def _heal_histogram(buckets: list[tuple[str, int]], total_s: float) -> HistogramMetricFamily:
    return HistogramMetricFamily("rankguard_pool_heal_seconds", "Seconds from losing the "
                                 "serving replica to a new one serving.", buckets=buckets,
                                 sum_value=total_s)
