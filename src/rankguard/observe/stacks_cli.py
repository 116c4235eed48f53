"""``rankguard stacks [RUN]``: the Python stacks of every rank of a running job, now, without
stopping it, grouped by identical stack so that the outlier stands out.

Each live rank of the run's current attempt on this node is asked (SIGUSR1: the rank writes
the stacks of all its threads from a C-level handler, even inside a collective); what it wrote
is grouped by main-thread stack. A run that has ended shows the last stacks its ranks wrote.
Exit codes: 0 stacks shown; 1 no rank answered; 2 bad usage or no such run.
"""

from __future__ import annotations


from ..processes import proctree, stack_summary, stack_requests
from ..inputs.options import Parser
from . import files, runs

PROG = "rankguard stacks"


def build_parser() -> Parser:
    p = runs.parser(PROG, "The Python stacks of every rank of a run, now, grouped by identical "
                    "stack; the job is not stopped.")
    p.add_argument("--full", action="store_true",
                   help="also print each rank's whole dump (every thread)")
    p.add_argument("--timeout", default="5", help="seconds the ranks get to answer (default 5)")
    return p


def main(argv: list[str]) -> int:
    parsed = runs.parse(build_parser(), argv, "--timeout", 0.01)
    if parsed is None:
        return 2
    args, budget, run = parsed
    live = [r for r in run.ranks if r.alive]
    if live:
        # only the run's own ranks (a journal may name any pid), and of those only the ones
        # whose runtime catches the request: a rank still starting would die of it
        own = [r for r in live if runs.started_here(run, r)]
        ready = [r for r in own if proctree.catches(r.pid, stack_requests.RANK_SIGNAL)]
        dumps = stack_requests.ask({r.rank: (r.pid, [r.stacks]) for r in ready}, budget,
                                   keep_stopped=True)  # a rank someone stopped stays stopped
        where = f"now, {len(dumps)} of {len(live)} live rank(s) answered"
        if len(ready) < len(own):
            where += (f" ({len(own) - len(ready)} still starting, not asked: "
                      "no stacks handler yet)")
        if len(own) < len(live):
            where += (f" ({len(live) - len(own)} not asked: their process was not started by "
                      f"this run for {run.log_dir})")
    else:
        dumps = {r.rank: stack_summary.last_dump(r.stacks) for r in run.ranks}
        dumps = {rank: text for rank, text in dumps.items() if text}
        where = ("the run has ended" if run.ended else "no rank is running") + \
            ("; the last stacks its ranks wrote" if dumps else "; no rank wrote stacks")
    # the journal and the dumps hold what the ranks' code named (its files, functions): on a
    # terminal, without control characters (escape sequences)
    print(files.printable(f"run {run.run_id}, {runs.attempt_words(run.attempt)}: {where}"))
    same = stack_summary.by_stack(dumps, [r.rank for r in (live or run.ranks)])
    for line in stack_summary.describe(same, "  "):
        print(files.printable(line))
    if args.full:
        for rank in sorted(dumps):
            print(f"\n--- rank {rank} ---\n{files.printable_lines(dumps[rank].rstrip())}")
    return 0 if dumps else 1
