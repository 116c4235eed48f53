"""The outcome of a test that ran on N ranks: the first failure, apart from its cascade.

When rank 1 fails an assertion, rank 0 waiting for it in a collective fails too, a victim. The
report puts first the ranks whose process ended during the test (how: its exit code, or the
signal that killed it), then the ranks that destroyed the process group while their peers
still used it (``dist.destroy_process_group()`` in the test: they passed, without their
group), then the rank that failed by itself, earliest in time (``blame``'s rule), with its
traceback; then the ranks that never finished (stuck), with their stacks; then the victims
(their error is a rankguard collective error: a peer's fault, not theirs), each with its
traceback."""

from __future__ import annotations

from typing import Any

from .. import blame
from .rank_tasks import DESTROYED


class RanksFailed(AssertionError):
    """A distributed test failed on one or more ranks; the message is the whole report."""


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def compose(world: int, answers: dict[int, dict[str, Any]], stacks: dict[int, str],
            logs: dict[int, str]) -> str | None:
    """The report, or None if every rank passed."""
    failed = {r: a for r, a in answers.items() if a.get("outcome") == "failed"}
    ended = {r: a["detail"] for r, a in answers.items() if a.get("outcome") == "ended"}
    # passed without their group: the test destroyed it on them (see rank_tasks)
    left = sorted(r for r, a in answers.items()
                  if a.get("outcome") == "passed" and a.get("group") is False)
    missing = sorted(set(range(world)) - set(answers))
    if not failed and not missing and not ended:
        return None
    own_first, consequences = blame.ordered(
        blame.Failure(r, a["at"], a["collective"], None) for r, a in failed.items())
    own = [f.rank for f in own_first]
    victims = [f.rank for f in consequences]
    head = [f"rank {rank} {detail} during the test" for rank, detail in sorted(ended.items())]
    if left:
        waiting = sorted([*victims, *missing])
        head.append(f"{_ranks(left)} {DESTROYED}"
                    + (f" while {_ranks(waiting)} still used it" if waiting else ""))
    if own and not ended and not left:
        head.append(f"{_ranks(own[:1])} failed first ({failed[own[0]]['error']})")
        if own[1:]:
            head.append(f"{_ranks(own[1:])} failed on their own too")
    elif own:
        head.append(f"{_ranks(own)} failed on {'its' if len(own) == 1 else 'their'} own too "
                    f"({', '.join(sorted({failed[r]['error'] for r in own}))})")
    if missing:
        head.append(f"{_ranks(missing)} never finished the test (stuck)")
    if victims:
        head.append(f"{_ranks(victims)} failed as a consequence "
                    f"({', '.join(sorted({failed[r]['error'] for r in victims}))})")
    passed = sorted(r for r, a in answers.items()
                    if a.get("outcome") == "passed" and r not in left)
    if passed:
        head.append(f"{_ranks(passed)} passed")
    sections = ["; ".join(head)]
    for rank, detail in sorted(ended.items()):
        sections.append(_section(f"rank {rank}: {detail} during the test",
                                 "(no traceback: its process ended)", logs, rank))
    for rank in left:
        sections.append(_section(f"rank {rank}: {DESTROYED}",
                                 "(no traceback: the test returned without the process group)",
                                 logs, rank))
    for rank in own:
        sections.append(_section(f"rank {rank}: failed first"
                                 if rank == own[0] and not ended and not left
                                 else f"rank {rank}: failed", failed[rank]["traceback"], logs,
                                 rank))
    for rank in missing:
        sections.append(_section(f"rank {rank}: stuck; its stacks", stacks.get(rank, ""), logs,
                                 rank))
    for rank in victims:
        sections.append(_section(f"rank {rank}: victim", failed[rank]["traceback"], logs, rank))
    return "\n\n".join(sections)


def _section(title: str, body: str, logs: dict[int, str], rank: int) -> str:
    text = f"----- {title} -----\n{body.rstrip()}"
    if logs.get(rank, "").strip():
        text += f"\n----- rank {rank}: output -----\n{logs[rank].rstrip()}"
    return text
