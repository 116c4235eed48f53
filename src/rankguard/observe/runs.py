"""Finding a run of ``rankguard run`` on this machine and its live ranks, from its journal."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

import psutil

from .. import private_files
from . import files
from ..errors import UsageError
from ..options import Parser, number

JOURNAL = "journal.jsonl"
START_SLACK_S = 1.0  # a rank's process started at most this long after its rank_start event


@dataclass(frozen=True)
class Rank:
    """A rank of the run's current attempt."""

    rank: int
    pid: int
    stacks: str  # its stacks file
    alive: bool


@dataclass(frozen=True)
class Run:
    run_id: str
    log_dir: str
    journal: str
    ended: bool  # the journal has its run_end
    attempt: int | None  # the last attempt started
    ranks: tuple[Rank, ...]  # that attempt's ranks on this node
    events: tuple[dict[str, Any], ...] = ()  # the journal, as read


def find(target: str | None) -> Run:
    """The run ``target`` names: a RUN_ID (its default log folder), a LOG_DIR or a journal
    file; None: the run whose journal changed last among this user's default log folders.

    Raises:
        UsageError: nothing of that name, or no run at all; naming what was looked at.
    """
    path = _journal_path(target)
    events = files.events(path)
    if not events:
        raise UsageError("RUN", f"{path} holds no event of a run",
                         "give the journal of a run of rankguard")
    run_id = next((e.get("run_id", "") for e in events), "")
    ended = any(e["event"] == "run_end" for e in events)
    attempts = [e["attempt"] for e in events if e["event"] == "attempt_start"]
    attempt = attempts[-1] if attempts else None
    log_dir = os.path.dirname(os.path.abspath(path))
    started = {e["rank"]: e for e in events
               if e["event"] == "rank_start" and e.get("attempt") == attempt}
    exited = {e["rank"] for e in events
              if e["event"] == "rank_exit" and e.get("attempt") == attempt}
    ranks = tuple(Rank(rank, event["pid"],
                       os.path.join(log_dir, f"attempt{attempt}", f"stacks_rank{rank}.txt"),
                       rank not in exited and not ended and _same_process(event))
                  for rank, event in sorted(started.items()))
    return Run(run_id, log_dir, path, ended, attempt, ranks, tuple(events))


def hang_text(event: dict[str, Any]) -> str:
    """A ``hang_detected`` event's verdict in words, as the launcher's summary gives it."""
    if event.get("verdict"):
        return str(event["verdict"])
    blamed = ",".join(str(r) for r in event.get("blamed", []))  # a journal of an older version
    group = event.get("group", "world")
    where = f"{event.get('op')} #{event.get('seq')}" + ("" if group == "world" else
                                                        f" on group {group}")
    return (f"rank(s) {blamed} never reached {where} ({event.get('reason')}); the others "
            f"waited {float(event.get('waited_s') or 0):.1f} s")


def last_fault(events: list[dict[str, Any]]) -> str | None:
    """The root cause of the run's latest failed attempt (or, while an attempt is being torn
    down after a hang verdict, that verdict), as the launcher's summary words it."""
    for event in reversed(events):
        if event["event"] in ("attempt_end", "restart", "run_end") and event.get("root_cause"):
            return str(event["root_cause"])
        if event["event"] == "hang_detected":
            return "hang: " + hang_text(event)
    return None


def _same_process(event: dict) -> bool:
    """Whether the pid of a rank_start event still is that rank's process (not a reused pid:
    its process started before the event, give or take START_SLACK_S)."""
    try:
        process = psutil.Process(event["pid"])
        return process.create_time() <= event["ts"] + START_SLACK_S and \
            process.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, KeyError, TypeError):
        return False


def _journal_path(target: str | None) -> str:
    if target is None:
        return _latest()
    candidates = [target, os.path.join(target, JOURNAL),
                  os.path.join(private_files.user_dir_path(), target, JOURNAL)]
    for path in candidates:
        if os.path.isfile(path) and (path.endswith(".jsonl") or path != target):
            return path
    raise UsageError("RUN", f"no run's journal at {target!r}",
                     "give a RUN_ID, whose log folder is $TMPDIR/rankguard-UID/RUN_ID, the run's "
                     "--log-dir, or its journal file")


def _latest() -> str:
    folder = private_files.user_dir_path()
    try:
        journals = [os.path.join(folder, name, JOURNAL) for name in os.listdir(folder)]
    except OSError:
        journals = []
    found = [(os.path.getmtime(p), p) for p in journals if os.path.isfile(p)]
    if not found:
        raise UsageError("RUN", f"no run under {folder}",
                         "give the RUN_ID, --log-dir or journal of the run")
    return max(found)[1]


def parser(prog: str, description: str) -> Parser:
    """A command's parser, with the RUN argument every command of observe/ takes."""
    p = Parser(prog=prog, allow_abbrev=False, description=description)
    p.add_argument("run", metavar="RUN", nargs="?", default=None,
                   help="the run's RUN_ID, --log-dir or journal file (default: the run of "
                   "yours whose journal changed last)")
    return p


def parse(p: Parser, argv: list[str], option: str, least: float
          ) -> tuple[argparse.Namespace, float, Run] | None:
    """The arguments, the seconds given by ``option`` (at least ``least``) and the run; None
    (the error printed as one line) for bad usage or no such run."""
    try:
        args = p.parse_args(argv)
        value = number(option, getattr(args, option.lstrip("-").replace("-", "_")), float,
                       least, f"a number of seconds, e.g. {option} 1")
        return args, value, find(args.run)
    except UsageError as error:
        print(f"{p.prog}: error: {error}", file=sys.stderr)
        return None
