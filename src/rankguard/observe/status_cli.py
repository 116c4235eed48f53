"""``rankguard status [RUN]``: a live view of a run's ranks (``observe.status``), refreshed
like ``top`` until the run ends or Ctrl-C; ``--once`` for one snapshot, ``--json`` for
machines. It touches nothing of the job. Exit codes: 0, or 2 for bad usage, no such run, or
a ``rankguard.Pool``'s journal (a pool has no attempts nor ranks to show here)."""

from __future__ import annotations

import json
import sys
import time

from ..errors import UsageError
from ..inputs.options import Parser
from ..records import journal
from . import files, runs, status

PROG = "rankguard status"
_CLEAR = "\x1b[H\x1b[2J"


def build_parser() -> Parser:
    p = runs.parser(PROG, "Each rank of a run: in which collective, since when, its process; "
                    "who the others wait for; restarts and the last fault. The job is not "
                    "touched.")
    p.add_argument("--once", action="store_true", help="one snapshot, then exit (the default "
                   "when the output is not a terminal)")
    p.add_argument("--json", action="store_true", help="one snapshot as JSON")
    p.add_argument("--interval", default="1", help="seconds between refreshes (default 1)")
    return p


def main(argv: list[str]) -> int:
    parsed = runs.parse(build_parser(), argv, "--interval", 0.1)
    if parsed is None:
        return 2
    args, interval, run = parsed
    if journal.of_pool(run.events):
        error = UsageError("RUN", f"{run.journal} is the journal of a rankguard.Pool (pool "
                           f"{run.run_id}), which has no attempts nor ranks to show",
                           "rankguard status shows the ranks of a run of rankguard run; a "
                           "pool's are in pool.status(), or rankguard serve's /healthz")
        print(files.printable(f"{PROG}: error: {error}"), file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(status.snapshot(run).as_json()))
        return 0
    if args.once or not sys.stdout.isatty():
        print(status.render(status.snapshot(run)))
        return 0
    try:
        while True:
            view = status.snapshot(run)
            sys.stdout.write(_CLEAR + status.render(view) + "\n")
            sys.stdout.flush()
            if view.ended or view.unfinished:
                return 0
            time.sleep(interval)
            run = runs.find(run.journal)  # a restart brings new ranks
    except KeyboardInterrupt:
        return 0
