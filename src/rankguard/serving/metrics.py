"""A pool's counters in the Prometheus text exposition format (version 0.0.4)."""

from __future__ import annotations

from collections.abc import Mapping

from .pool import PoolStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CAUSES = ("raised", "exited", "signalled", "frozen", "deadline")
STATES = ("starting", "ready", "healing", "failed", "closed")
# a call's outcome: its result; RequestFailed; PoolUnavailable; PoolClosed (before it started,
# or cut by the pool's close)
OUTCOMES = ("ok", "failed", "unavailable", "closed")


def exposition(values: Mapping[str, float], status: PoolStatus,
               http_codes: Mapping[tuple[str, int], int], client_disconnects: int = 0) -> str:
    """The text a Prometheus scrape of ``/metrics`` gets: ``values`` from ``Pool.metrics()``,
    the pool's ``status``, the count of HTTP responses by route and status code, and of the
    clients that left before they sent the whole body."""
    lines: list[str] = []

    def family(name: str, kind: str, text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{suffix} {_number(value)}" for suffix, value in samples)

    family("rankguard_pool_requests_total", "counter", "Pool calls by outcome.",
           [(f'{{outcome="{o}"}}', values.get(f"requests_{o}", 0))
            for o in OUTCOMES])
    family("rankguard_pool_faults_total", "counter", "Failed calls by the cause of the fault.",
           [(f'{{cause="{c}"}}', values.get(f"faults_{c}", 0)) for c in CAUSES])
    family("rankguard_pool_heals_total", "counter",
           "Times a new group took over after the serving group was lost.",
           [("", values.get("heals", 0))])
    family("rankguard_pool_heal_seconds", "summary",
           "Seconds from losing the serving group to a new one serving.",
           [("_sum", values.get("heal_seconds_sum", 0)),
            ("_count", values.get("heal_seconds_count", 0))])
    family("rankguard_pool_start_failures_total", "counter", "Group start-ups that failed.",
           [("", values.get("start_failures", 0))])
    family("rankguard_pool_spares_ready", "gauge", "Spare groups ready to take over.",
           [("", status.spares_ready)])
    family("rankguard_pool_spares_starting", "gauge", "Groups starting.",
           [("", status.spares_starting)])
    family("rankguard_pool_state", "gauge", "The pool's state (1 for the current one).",
           [(f'{{state="{s}"}}', int(status.state == s)) for s in STATES])
    family("rankguard_http_responses_total", "counter", "HTTP responses by route and status "
           "code.", [(f'{{route="{route}",code="{code}"}}', count)
                     for (route, code), count in sorted(http_codes.items())])
    family("rankguard_http_client_disconnects_total", "counter", "Requests whose client "
           "closed the connection before it sent the whole body (not answered).",
           [("", client_disconnects)])
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
