"""``rankguard flight-recorder [RUN]``: an attempt's recent operations as PyTorch Flight Recorder
dumps (``observe.flight_recorder``), for ``python -m torch.distributed.flight_recorder.fr_trace``.

Exit codes: 0 dumps written; 1 the attempt kept no recent operations (a run of an older
rankguard, or ranks that never started); 2 bad usage, no such run, or the folder cannot be
written.
"""

from __future__ import annotations

import os
import sys

from .. import recent_file
from ..errors import UsageError
from ..options import number
from . import flight_recorder, runs

PROG = "rankguard flight-recorder"


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
        attempt = _attempt(events, args.attempt)
    except UsageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    kept = recent_file.read_attempt(os.path.join(run.log_dir, f"attempt{attempt}"))
    if not kept:
        print(f"{PROG}: run {run.run_id}, attempt {attempt}: no rank's recent operations were "
              "kept (ranks that never started, or a run of an older rankguard)", file=sys.stderr)
        return 1
    folder = args.output or os.path.join(run.log_dir, "flight_recorder", f"attempt{attempt}")
    try:
        files = flight_recorder.write(folder, kept, _world_size(events, kept))
    except OSError as exc:
        print(f"{PROG}: error: cannot write {folder}: {exc.strerror or exc} (give another "
              "folder with -o)", file=sys.stderr)
        return 2
    print(f"{PROG}: run {run.run_id}, attempt {attempt}: {len(files)} dump(s) in {folder}\n"
          f"  analyse them with: python -m torch.distributed.flight_recorder.fr_trace {folder}")
    return 0


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
    """The job's world size: a round's (several nodes), else the node's ranks."""
    rounds = [e["world_size"] for e in events if e["event"] == "rendezvous" and "world_size" in e]
    if rounds:
        return int(rounds[-1])
    start = next((e for e in events if e["event"] == "run_start"), {})
    return int(start.get("nproc") or max(kept) + 1)
