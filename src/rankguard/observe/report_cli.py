"""``rankguard report [RUN]``: a run (or a Pool's journal) as one self-contained HTML file with
a timeline: a lane per rank per attempt with the operations it entered, the fault, the verdict,
the escalation steps, restarts and spares, and the grouped stacks.

Exit codes: 0 the report was written; 2 bad usage, no such run, or the file cannot be written.
"""

from __future__ import annotations

import os
import sys

from .. import recent_file
from ..errors import UsageError
from . import report, runs, timeline

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
        recent = {n: recent_file.read_attempt(os.path.join(run.log_dir, f"attempt{n}"))
                  for n in attempts}
        view = timeline.of_run(events, recent)
    target = args.output or os.path.join(run.log_dir, FILE)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(report.render(view))
    except OSError as exc:
        print(f"{PROG}: error: cannot write {target}: {exc.strerror or exc} (give another "
              "file with -o)", file=sys.stderr)
        return 2
    print(f"{PROG}: {view.title}: {view.summary}\n  wrote {target}")
    return 0
