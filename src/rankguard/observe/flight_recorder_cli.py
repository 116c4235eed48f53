"""``rankguard flight-recorder [RUN]``: an attempt's recent operations as PyTorch Flight Recorder
dumps (``observe.flight_recorder``), for ``python -m torch.distributed.flight_recorder.fr_trace``.

The dumps go only into a folder of the user's own that no other user can write, reached
without a symlink below the folder the user named (``flight_recorder.write``).

Exit codes: 0 dumps written; 1 the attempt kept no recent operations (a run of an older
rankguard, or ranks that never started); 2 bad usage, no such run, a ``rankguard.Pool``'s
journal (a pool keeps no attempts), or the folder cannot be written.
"""

from __future__ import annotations

import os
import sys

from ..records import journal, recent_file
from ..errors import UsageError
from ..inputs.options import missing_dirs, number
from . import files, flight_recorder, runs

PROG = "rankguard flight-recorder"
MAX_WORLD = 1 << 16


def main(argv: list[str]) -> int:
    p = runs.parser(PROG, "Write an attempt's recent operations as PyTorch Flight Recorder "
                    "dumps (one per rank), for torch's trace analyser.")
    p.add_argument("--attempt", default=None,
                   help="which attempt (default: the last that failed, else the last)")
    p.add_argument("-o", "--output", default=None,
                   help="the folder to write (default: flight_recorder/attemptN in the run's "
                   "log folder)")
    try:
        args = p.parse_args(argv)
        run = runs.find(args.run)
        events = list(run.events)
        if journal.of_pool(events):
            raise UsageError("RUN", f"{run.journal} is the journal of a rankguard.Pool (pool "
                             f"{files.printable(run.run_id)}), which has no attempts nor ranks' recent "
                             f"operations", "rankguard flight-recorder works on the runs of "
                             "rankguard run; rankguard report draws a pool's journal")
        attempt = _attempt(events, args.attempt)
    except UsageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    kept = runs.recent(run, attempt)
    if not kept:
        print(files.printable(f"{PROG}: run {run.run_id}, attempt {attempt}: ") +
              "no rank's recent operations were kept (ranks that never started, or a run of an "
              "older rankguard)", file=sys.stderr)
        return 1
    world = _world_size(events, kept)
    try:
        base, parts = _output(run.log_dir, attempt, args.output)
        folder = os.path.join(base, *parts)
        written = flight_recorder.write(base, parts, kept, world)
    except UsageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    analyse = f"python -m torch.distributed.flight_recorder.fr_trace {folder}"
    local = _local_ranks(events, attempt)
    missing = sorted(set(local) - set(kept))
    print(files.printable(f"{PROG}: run {run.run_id}, attempt {attempt}: ") +
          f"{len(written)} dump(s) in {folder}")
    if missing:
        print(f"  rank(s) {','.join(map(str, missing))} kept no recent operations (they never "
              "started, or their ledger could not be read): the analyser needs "
              "--allow-incomplete-ranks")
        analyse += " --allow-incomplete-ranks"
    if len(local) < world:
        print(f"  this node's ranks only ({len(local)} of {world}): put every node's dumps in "
              "one folder for the whole job")
    print(f"  analyse them with: {analyse}")
    return 0


def _output(log_dir: str, attempt: int, given: str | None) -> tuple[str, tuple[str, ...]]:
    """Where the dumps go, as ``flight_recorder.write`` takes it: a folder as the user named it
    (followed), then the folders below it that must be private: by default the run's log
    folder itself, ``flight_recorder`` and ``attemptN``; for ``-o``, the folders of it that do
    not exist yet, or, when it exists, none (``-o`` itself is then the folder checked)."""
    if given is None:
        return os.path.dirname(log_dir), (os.path.basename(log_dir), "flight_recorder",
                                          f"attempt{attempt}")
    if not given:
        raise UsageError("-o", "is empty", "give a folder for the dumps")
    missing = missing_dirs(given)
    if not missing:
        return os.path.abspath(given), ()
    return os.path.dirname(missing[0]), tuple(os.path.basename(m) for m in missing)


def _local_ranks(events: list[dict], attempt: int) -> list[int]:
    """The ranks this node started in attempt ``attempt``."""
    return sorted({e["rank"] for e in events if e["event"] == "rank_start"
                   and e.get("attempt") == attempt and isinstance(e.get("rank"), int)})


def _attempt(events: list[dict], given: str | None) -> int:
    started = [int(e["attempt"]) for e in events if e["event"] == "attempt_start"]
    if not started:
        raise UsageError("RUN", "the run started no attempt", "give a run that ran")
    if given is not None:
        chosen = int(number("--attempt", given, int, 0, "an attempt number, e.g. --attempt 0"))
        if chosen not in started:
            raise UsageError("--attempt", f"the run has no attempt {chosen}",
                             f"its attempts: {', '.join(map(str, started))}")
        return chosen
    failed = [int(e["attempt"]) for e in events if e["event"] == "attempt_end" and e.get("fault")]
    return failed[-1] if failed else started[-1]


def _world_size(events: list[dict], kept: dict[int, recent_file.RankRecent]) -> int:
    """The job's world size: a round's (several nodes), else the node's ranks; never fewer
    than the ranks kept, and not more than ``MAX_WORLD`` (a journal may say anything)."""
    least = max(kept) + 1
    rounds = [e.get("world_size") for e in events if e["event"] == "rendezvous"]
    start = next((e for e in events if e["event"] == "run_start"), {})
    said = rounds[-1] if rounds else start.get("nproc")
    return said if isinstance(said, int) and least <= said <= MAX_WORLD else least
