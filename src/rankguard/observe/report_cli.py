"""``rankguard report [RUN]``: a run (or a Pool's journal) as one self-contained HTML file with
a timeline: a lane per rank per attempt with the operations it entered, the fault, the verdict,
the escalation steps, restarts and spares, and the grouped stacks.

The report is written only into a folder of the user's own that no other user can write (as
``rankguard run``'s runs folder: ``private_files``), never through a symlink.

Exit codes: 0 the report was written; 2 bad usage, no such run, or the file cannot be written
(there).
"""

from __future__ import annotations

import os
import sys

from ..errors import UsageError
from . import files, report, runs, timeline

PROG = "rankguard report"
FILE = "report.html"


def main(argv: list[str]) -> int:
    p = runs.parser(PROG, "A run as one self-contained HTML file with a timeline of every "
                    "rank (no network needed to view it).")
    p.add_argument("-o", "--output", default=None,
                   help=f"the file to write (default: {FILE} in the run's log folder)")
    try:
        args = p.parse_args(argv)
        run = runs.find(args.run)
    except UsageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    events = list(run.events)
    if any(e["event"] == "pool_start" for e in events):
        view = timeline.of_pool(events)
    else:
        attempts = sorted({int(e["attempt"]) for e in events if e["event"] == "attempt_start"})
        recent = {n: runs.recent(run, n) for n in attempts}
        view = timeline.of_run(events, recent, run.unfinished)
    target = os.path.join(run.log_dir, FILE) if args.output is None else args.output
    page = report.render(view).encode("utf-8", errors="replace")
    try:
        files.write_private(target, "-o", page)
    except UsageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    print(files.printable(f"{PROG}: {view.title}: {view.summary}") + f"\n  wrote {target}")
    return 0
