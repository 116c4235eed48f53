"""Processes a test left behind: found when its teardown ends, reported, killed.

A process is the test's if it carries the test's environment tag, or if the session's
``proctree.Tracking`` holds it and did not before the test (a descendant of the test process, or
one that cleared its environment and detached: see ``processes``). Processes started by a fixture of a wider scope (module,
session) carry that fixture's tag instead, and are checked when that fixture is finalized.
One that exits within ``LEFTOVER_EXIT_S`` of the end (a child finishing its exit: its pidfd
wakes the wait) is not a leak, nor is multiprocessing's resource tracker or forkserver, which
serve the whole test process.
"""

from __future__ import annotations

from ..processes import proctree
from ..deadline import Deadline
from . import processes

LEFTOVER_EXIT_S = 0.5
MODES = ("fail", "warn", "ignore")


class LeakedProcesses(Exception):
    """A test (or fixture) left processes running; they have been killed.

    Attributes:
        described: one line per process (pid, name, state, command line).
    """

    def __init__(self, owner: str, described: list[str]) -> None:
        self.described = described
        super().__init__(f"{owner} left {len(described)} process(es) running (now killed):\n  "
                         + "\n  ".join(described))


def find(tag: str, known: set[int], tracking: proctree.Tracking | None) -> list[int]:
    """The live processes of ``tag`` (and, with ``tracking``, the ones it holds) but ``known``,
    that are still there after up to ``LEFTOVER_EXIT_S`` s: each look waits on the exits of
    those it found (pidfds), then looks again for any they started meanwhile."""
    settled = Deadline.after(LEFTOVER_EXIT_S)
    while True:
        found = set(processes.tagged(tag, known))
        if tracking is not None:
            found.update(pid for pid in tracking.processes() if pid not in known)
        found = {pid for pid in found
                 if proctree.alive(pid) and not processes.is_shared_helper(pid)}
        if not found or settled.passed():
            return sorted(found)
        proctree.await_exits(found, settled)


def collect(tag: str, known: set[int], tracking: proctree.Tracking | None) -> list[str]:
    """Find the leaked processes, describe them, kill them (and their descendants, reaping the
    orphans re-parented to this process); returns the descriptions."""
    pids = find(tag, known, tracking)
    described = [proctree.describe(pid) for pid in pids]
    proctree.kill_and_reap(sorted({p for pid in pids for p in [pid, *proctree.descendants(pid)]}))
    return described
