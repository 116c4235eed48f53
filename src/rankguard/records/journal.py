"""The journal: one JSON object per line for every fault, decision and timing of a run.

Summaries, reports and tests read the journal, never log text. Every event has ``event`` (its
name), ``ts`` (wall-clock seconds since the epoch) and ``run_id``; the other fields depend on the
event and are listed in the README ("Journal events"). Names and fields are a stable interface:
add fields, never rename or remove them.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any, Iterable, Iterator

from . import private_files

EVENTS = (
    "run_start",
    "attempt_start",
    "rank_start",
    "rank_exit",
    "first_step",
    "spares",
    "straggler",
    "hang_detected",
    "stacks",
    "escalate",
    "attempt_end",
    "restart",
    "replace",
    "replaced",
    "replace_refused",
    "standby",
    "node_takeover",
    "node_taken_over",
    "leftover",
    "linger",
    "rendezvous",
    "round_end",
    "injection_never_fired",
    "run_end",
    "pool_start",
    "zygote_start",
    "zygote_failed",
    "group_start",
    "group_ready",
    "group_start_failed",
    "request",
    "request_fault",
    "group_suspect",
    "group_retire",
    "ranks_replace",
    "warm_spare_failed",
    "heal",
    "pool_close",
)


class Journal:
    """Appends events to a JSON-lines file, flushed after each event."""

    def __init__(self, path: str, run_id: str) -> None:
        """Open ``path`` for appending (created 0600 if missing).

        Raises:
            OSError: it cannot be opened, or something another user could have planted is
                there (:func:`~rankguard.records.private_files.own_opener`).
        """
        self.path = path
        self.run_id = run_id
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._created = not os.path.lexists(path)
        # 0600 like the ranks' output; a symbolic link, a file of someone else's or with other
        # names found at the path (which may be in /tmp) is refused, never written through
        self._file = open(path, "a", buffering=1,  # noqa: SIM115 (closed by close())
                          opener=private_files.own_opener)
        self._lock = threading.Lock()  # a pool writes from its supervisor and callers' threads
        self._context: dict[str, Any] = {}

    def context(self, **fields: Any) -> None:
        """Write ``fields`` into every later event (a multi-node agent's ``round``), unless the
        event gives them itself."""
        self._context = {**self._context, **fields}

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event and return it. ``event`` must be one of :data:`EVENTS`."""
        if event not in EVENTS:
            raise ValueError(f"unknown journal event {event!r}")
        record = {"event": event, "ts": round(time.time(), 6), "run_id": self.run_id,
                  **self._context, **fields}
        line = json.dumps(record, default=str) + "\n"
        with self._lock:
            self._file.write(line)
        return record

    def close(self) -> None:
        self._file.close()

    def discard(self) -> None:
        """Close it, and remove the file where this journal created it and wrote nothing (a run
        that ended before it started leaves no empty journal behind)."""
        self.close()
        if self._created:
            with contextlib.suppress(OSError):
                if os.path.getsize(self.path) == 0:
                    os.unlink(self.path)


def of_pool(events: Iterable[dict[str, Any]]) -> bool:
    """Whether ``events`` are a ``rankguard.Pool``'s journal (its ``pool_start``), not a run's
    of ``rankguard run``: the commands that look at a run's attempts and ranks say so of a
    pool's rather than find no attempt in it."""
    return any(e.get("event") == "pool_start" for e in events)


def read(path: str) -> Iterator[dict[str, Any]]:
    """The events of a journal file, in order (a torn last line is skipped)."""
    with open(path) as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
