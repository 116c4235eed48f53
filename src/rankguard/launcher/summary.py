"""The short report printed when a run ends: root cause, each rank's outcome, timings."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..processes import stack_summary
from .outcome import RankOutcome


@dataclass
class AttemptReport:
    attempt: int
    outcomes: list[RankOutcome]
    root_cause: str | None
    verdict: str | None = None
    stacks: dict[int, str] = field(default_factory=dict)
    detect_s: float | None = None  # fault -> verdict or death seen
    stop_s: float | None = None  # fault -> every rank stopped
    first_step_s: float | None = None  # attempt start -> first collective done on all ranks


def render(run_id: str, status: str, exit_code: int, reports: list[AttemptReport],
           log_dir: str, journal_path: str, restart_s: list[float],
           terminal_note: str | None = None, unfired: list[str] | None = None) -> str:
    """The summary; ``terminal_note``: what the terminal lost, if anything (a line);
    ``unfired``: a line for each injected fault that never fired, said first after the result
    (a run that "succeeded" without its fault tested nothing)."""
    ran = (f"after {len(reports)} attempt{'s' if len(reports) != 1 else ''}" if reports
           else "and ran no attempt")
    lines = [f"rankguard: run {run_id} {status} {ran} (exit code {exit_code})"]
    lines.extend(f"  {line}" for line in unfired or ())
    first_fault = next((r for r in reports if r.root_cause), None)
    if first_fault is not None:
        lines.append(f"  root cause: {first_fault.root_cause} (attempt {first_fault.attempt})")
    for report in reports:
        ranks = "  ".join(f"{o.rank}:{o.outcome}" for o in report.outcomes)
        lines.append(f"  attempt {report.attempt}: {ranks or 'no rank started'}")
        if report.verdict:
            lines.append(f"    verdict: {report.verdict}")
        if report.stacks:
            lines.append(f"    stacks: {', '.join(sorted(set(report.stacks.values())))}")
            lines.extend(_by_stack(report.stacks))
        timings = []
        if report.detect_s is not None:
            timings.append(f"detected in {report.detect_s:.2f} s")
        if report.stop_s is not None:
            timings.append(f"all ranks stopped {report.stop_s:.2f} s after the fault")
        if report.first_step_s is not None:
            timings.append(f"first step {report.first_step_s:.2f} s after start")
        if timings:
            lines.append(f"    {'; '.join(timings)}")
    if restart_s:
        lines.append("  fault to first step of the restarted attempt: "
                     + ", ".join(f"{s:.2f} s" for s in restart_s))
    if terminal_note:
        lines.append(f"  {terminal_note}")
    lines.append(f"  logs: {log_dir}  journal: {journal_path}")
    return "\n".join(lines)


def _by_stack(stacks: dict[int, str]) -> list[str]:
    """Where each rank's main thread was, ranks in the same place together (from the last dump
    in each rank's stacks file); nothing when no file holds a dump."""
    dumps = {rank: stack_summary.last_dump(path) for rank, path in stacks.items()}
    same = stack_summary.by_stack(dumps, sorted(stacks))
    if not any(s.frames for s in same):
        return []
    return stack_summary.describe(same, "      ")
