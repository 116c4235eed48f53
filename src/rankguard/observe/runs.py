"""Finding a run of ``rankguard run`` on this machine and its live ranks, from its journal."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

import psutil

from ..records import private_files, recent_file
from . import files
from ..errors import UsageError
from ..inputs.options import Parser, number

JOURNAL = "journal.jsonl"
LOG_DIR_ENV = "RANKGUARD_LOG_DIR"  # set by the launcher in each rank's environment
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
    # the run is over though its journal has no run_end (its launcher was killed): in words
    unfinished: str | None = None


def attempt_words(attempt: int | None) -> str:
    """``attempt N``, or ``no attempt started`` for a run that started none."""
    return "no attempt started" if attempt is None else f"attempt {attempt}"


def find(target: str | None) -> Run:
    """The run ``target`` names: a RUN_ID (its default log folder), a LOG_DIR or a journal
    file; None: the run whose journal changed last among this user's default log folders.
    A run of several nodes has a log folder per agent, ``RUN_ID/HOST-PID``: its RUN_ID (or
    the folder above) names the one agent that ran on this machine.

    Raises:
        UsageError: nothing of that name, or no run at all, naming the latest runs there are;
            a RUN_ID of several agents on this machine, naming each (``RUN_ID/HOST-PID``).
    """
    path = _journal_path(target)
    events = latest_run(files.events(path))
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
    return Run(run_id, log_dir, path, ended, attempt, ranks, tuple(events),
               None if ended else _unfinished(events))


def latest_run(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of the journal's latest run. A log folder (or a ``--journal``) given to a
    later run again holds each run's events one after the other, from its ``run_start`` (a
    pool's ``pool_start``): the commands show the latest, the one that may be running."""
    starts = [i for i, e in enumerate(events) if e["event"] in ("run_start", "pool_start")]
    return events[starts[-1]:] if starts else events


def recent(run: Run, attempt: int) -> dict[int, recent_file.RankRecent]:
    """The recent operations kept of ``attempt``'s ranks (``recent_file.read_attempt``), each
    only if the run's journal names its process as that rank's in that attempt: a file left
    in the folder by an earlier run of the same log folder is not this run's."""
    pids: dict[int, set[int]] = {}
    for e in run.events:
        if e.get("attempt") == attempt and e["event"] in ("rank_start", "replace") and \
                isinstance(e.get("rank"), int):
            pids.setdefault(e["rank"], set()).update(
                e.get(name) for name in ("pid", "old_pid", "new_pid"))
    kept = recent_file.read_attempt(os.path.join(run.log_dir, f"attempt{attempt}"))
    return {rank: ops for rank, ops in kept.items() if ops.pid in pids.get(rank, ())}


def live_launcher(run: Run) -> int | None:
    """The pid of ``run``'s launcher while the run goes on and that process still is its
    launcher (not a reused pid); None otherwise."""
    start = _launcher_start(run.events)
    if run.ended or run.unfinished or start is None:
        return None
    return start["pid"] if _same_process(start) else None


def _launcher_start(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's ``run_start``, where it names its launcher's pid; None otherwise."""
    start = next((e for e in events if e["event"] == "run_start"), None)
    return start if start is not None and isinstance(start.get("pid"), int) else None


def _unfinished(events: list[dict[str, Any]]) -> str | None:
    """Why a journal without its run_end will never have one: its launcher (the run_start's
    pid) is gone. None: it lives, or the journal does not say which process it was."""
    start = _launcher_start(events)
    if start is None or _same_process(start):
        return None
    return (f"its launcher (pid {start['pid']}) is gone without ending the journal "
            "(killed, e.g. SIGKILL or out of memory)")


def started_here(run: Run, rank: Rank) -> bool:
    """Whether ``rank``'s process is one that ``rankguard run`` started for this run's log
    folder (its environment's ``RANKGUARD_LOG_DIR``, the launcher's contract with its ranks and
    spares, is that folder). A journal names pids, and whoever could write it may name any
    process: one not proven to be the run's rank is never signalled. False when its
    environment cannot be read (another user's process)."""
    try:
        folder = psutil.Process(rank.pid).environ().get(LOG_DIR_ENV)
        return folder is not None and os.path.samefile(folder, run.log_dir)
    except (psutil.Error, OSError):
        return False


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
    base = private_files.user_dir_path()
    user_folder = os.path.join(base, target)
    if not target.strip():
        raise UsageError("RUN", "is empty", _known_runs())
    if any(os.path.realpath(folder) == os.path.realpath(base) for folder in (target, user_folder)
           if os.path.isdir(folder)):
        raise UsageError("RUN", f"{target!r} is the folder of every run, not one run",
                         _known_runs())
    if os.path.isfile(target) and target.endswith(".jsonl"):
        return target
    own = _journal_in(target, target)
    if own is None and user_folder != target:  # a RUN_ID: searched in the runs' folder
        own = _journal_in(os.path.join(runs_folder(), target), target)
    if own is not None:
        return own
    raise UsageError("RUN", f"no run's journal at {target!r}", _known_runs())


def _journal_in(folder: str, target: str) -> str | None:
    """The journal of the run whose log folder is ``folder`` (``target`` names it), or of
    the one node agent of it that ran here; None: no journal there.

    Raises:
        UsageError: several node agents of the run ran here, or something other than a regular
            file is at the journal's name.
    """
    own = os.path.join(folder, JOURNAL)
    if os.path.isfile(own):
        return own
    if os.path.lexists(own):
        raise UsageError("RUN", f"{own!r} is not a regular file (a FIFO, a device, a folder or "
                         "a link to none): it is not a journal rankguard run wrote, and is not "
                         "read", "give the log folder or the journal of a run of rankguard run")
    nodes = node_journals(folder)
    if len(nodes) == 1:  # one agent of a run of several nodes ran on this machine
        return nodes[0]
    if nodes:
        names = [os.path.join(target, os.path.basename(os.path.dirname(p))) for p in nodes]
        raise UsageError("RUN", f"{target!r} is a run of several nodes, {len(nodes)} of "
                         f"whose agents ran on this machine, each with its own log folder",
                         "give one of them: " + ", ".join(names))
    return None


def runs_folder() -> str:
    """This user's folder of runs (``$TMPDIR/rankguard-UID``, the default ``--log-dir``'s),
    before anything in it is read: refused, as ``rankguard run`` refuses it, unless it is a
    folder of this user's that only this user can write, since anyone who can write it can
    plant a run there (or a link), and have its journal read and the output written where they
    choose. Missing is fine: it has no run.

    Raises:
        UsageError: it is a symlink, not a folder, another user's, or writable by others.
    """
    folder = private_files.user_dir_path()
    if os.path.lexists(folder):
        private_files.check_private(folder, "RUN", "remove it, or give the run's --log-dir "
                                    "or journal file")
    return folder


def node_journals(folder: str) -> list[str]:
    """The journals of the node agents whose log folders are in ``folder``, latest first: a
    run of several nodes keeps each agent's in ``RUN_ID/HOST-PID/`` (``launcher.cli``)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = [os.path.join(folder, name, JOURNAL) for name in names]
    return [p for _, p in sorted(((os.path.getmtime(p), p) for p in found
                                  if os.path.isfile(p)), reverse=True)]


def _known_runs(shown: int = 5) -> str:
    """The hint of a RUN that names nothing: the latest runs there are, by name."""
    folder = private_files.user_dir_path()
    names = [os.path.relpath(os.path.dirname(p), folder) for _, p in _journals()[:shown]]
    if not names:
        return (f"no run is under {folder}: give the run's --log-dir or its journal file")
    return (f"the latest runs under {folder}: {', '.join(names)}; or give a run's --log-dir "
            "or its journal file")


def _journals() -> list[tuple[float, str]]:
    """Every journal under this user's default log folders, one run's or one node agent's
    (``RUN_ID/HOST-PID``), latest first."""
    folder = runs_folder()
    try:
        runs = [os.path.join(folder, name) for name in os.listdir(folder)]
    except OSError:
        runs = []
    journals = []
    for run in runs:
        own = os.path.join(run, JOURNAL)
        journals.extend([own] if os.path.isfile(own) else node_journals(run))
    return sorted(((os.path.getmtime(p), p) for p in journals), reverse=True)


def _latest() -> str:
    found = _journals()
    if not found:
        raise UsageError("RUN", f"no run under {private_files.user_dir_path()}",
                         "give the RUN_ID, --log-dir or journal of the run")
    return found[0][1]


def parser(prog: str, description: str) -> Parser:
    """A command's parser, with the RUN argument every command of observe/ takes."""
    p = Parser(prog=prog, allow_abbrev=False, description=description)
    p.add_argument("run", metavar="RUN", nargs="?", default=None,
                   help="the run's RUN_ID (RUN_ID/HOST-PID for one node agent's, where "
                   "several ran here), --log-dir or journal file (default: the run of yours "
                   "whose journal changed last)")
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
