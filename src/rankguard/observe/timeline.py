"""A run as a timeline: per attempt, a lane per rank with the operations it entered (from the
recent-operations files the launcher keeps, ``recent_file``), and the run's moments from its
journal (the fault, the verdict, the escalation steps, restarts, spares). A Pool's journal gives
a lane per group instead, with its faults, suspicions and heals.

Pure: ``of_run`` and ``of_pool`` take the journal's events and the files' contents; times are
wall-clock seconds as the journal has them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..records import recent_file
from ..processes import stack_summary
from . import files, runs

_SAME_MOMENT_S = 0.05  # rank exits this close together are shown as one mark


@dataclass(frozen=True)
class Span:
    """An operation on a lane: entered at ``t0``, seen completed at ``t1`` (None: never)."""

    t0: float
    t1: float | None
    label: str  # all_reduce #57, barrier #3 on group ranks 0,2
    op: str  # all_reduce
    timed: bool = False  # t0 to t1 is its real duration (a pool's request), not when it was seen
    # an asynchronous group's operation (NCCL's): t0 is when the CPU enqueued it; when its
    # device was seen starting it (None: not seen, or not known); its inputs' bytes
    asynchronous: bool = False
    t_started: float | None = None
    nbytes: int | None = None


@dataclass(frozen=True)
class Mark:
    """A moment of the run: ``kind`` is fault, verdict, escalate, restart, spares, first_step,
    straggler, exit, replace, replaced, injection (one that never fired), suspect, heal, retire
    or ready."""

    t: float
    kind: str
    text: str
    lane: int | None = None  # the rank (or group) it belongs to; None: the whole attempt


@dataclass
class Lane:
    """One rank of an attempt (or one group of a pool)."""

    key: int
    title: str  # rank 3 (pid 1234), group 2
    t_start: float
    t_end: float | None = None  # its exit; None: still running when the journal ends
    outcome: str = ""  # ok, crashed, hung, victim, ...; a group's: retired, closed
    spans: list[Span] = field(default_factory=list)
    earlier: bool = False  # the ring had overwritten older operations


@dataclass
class Section:
    """One attempt of a run, or a pool's whole life."""

    title: str
    t_start: float
    t_end: float
    lanes: list[Lane]
    marks: list[Mark]
    cause: str | None = None  # the root cause, if it failed
    verdict: str | None = None  # the hang verdict, if one was made
    stacks: list[str] = field(default_factory=list)  # grouped stacks, one line per group


@dataclass
class Timeline:
    title: str
    summary: str  # status, exit code, root cause
    sections: list[Section]


def of_run(events: list[dict[str, Any]], recent: Mapping[int, Mapping[int, recent_file.RankRecent]],
           unfinished: str | None = None) -> Timeline:
    """A launcher run: ``events`` its journal, ``recent`` its recent-operations files by
    attempt, then rank; ``unfinished``: why a journal without its run_end will never have one
    (``runs.Run.unfinished``)."""
    run_id = next((e.get("run_id", "") for e in events), "")
    end = next((e for e in events if e["event"] == "run_end"), None)
    last_ts = events[-1]["ts"] if events else 0.0
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    attempt = None
    for event in events:
        attempt = event.get("attempt", attempt) if event["event"] != "restart" else attempt
        if attempt is not None:
            by_attempt.setdefault(int(attempt), []).append(event)
    sections = [_attempt(number, by_attempt[number], recent.get(number, {}), last_ts)
                for number in sorted(by_attempt)]
    if end is None:
        summary = f"over, {unfinished}" if unfinished else \
            "running (the journal has no run_end yet)"
    else:
        summary = f"{end.get('status')}, exit code {end.get('exit_code')}"
        if end.get("root_cause"):
            summary += f"; root cause: {end['root_cause']}"
    return Timeline(f"run {run_id}", summary, sections)


def _attempt(number: int, events: list[dict[str, Any]],
             recent: Mapping[int, recent_file.RankRecent], last_ts: float) -> Section:
    start = next((e["ts"] for e in events if e["event"] == "attempt_start"), events[0]["ts"])
    lanes: dict[int, Lane] = {}
    marks: list[Mark] = []
    section = Section(f"attempt {number}", start, start, [], marks)
    for event in events:
        kind, ts = event["event"], event["ts"]
        if kind == "rank_start":
            lanes[event["rank"]] = Lane(event["rank"],
                                        f"rank {event['rank']} (pid {event['pid']})", ts)
        elif kind == "rank_exit" and event.get("rank") in lanes:
            lane = lanes[event["rank"]]
            lane.t_end, lane.outcome = ts, str(event.get("outcome", ""))
            marks.append(Mark(ts, "exit", f"rank {lane.key} exits: {lane.outcome}", lane.key))
        elif kind == "first_step":
            marks.append(Mark(ts, "first_step", "every rank completed its first collective"))
        elif kind == "hang_detected":
            section.verdict = runs.hang_text(event)
            marks.append(Mark(ts, "verdict", f"hang verdict: {section.verdict}"))
            section.stacks = _stacks_by_place(event.get("stacks"), sorted(lanes))
        elif kind == "stacks":
            section.stacks = _stacks_by_place(event.get("stacks"), sorted(lanes))
        elif kind == "straggler":
            marks.append(Mark(ts, "straggler", f"straggler: {_ranks(event.get('ranks'))} in "
                              f"{event.get('op')} #{event.get('seq')}"))
        elif kind == "escalate":
            marks.append(Mark(ts, "escalate", f"{event.get('step')}: "
                              f"{_ranks(event.get('ranks'))} ({event.get('reason')})"))
        elif kind == "injection_never_fired":  # written as the run ended
            marks.append(Mark(ts, "injection", str(event.get("message", "")), event.get("rank")))
        elif kind == "spares":
            marks.append(Mark(ts, "spares", f"{event.get('started')} warm spare(s) started"))
        elif kind == "attempt_end":
            section.cause = event.get("root_cause")
            at = files.finite(event.get("at"))
            if event.get("fault") and at is not None:
                marks.append(Mark(at, "fault", f"fault: {section.cause}", event.get("rank")))
        elif kind == "restart":
            marks.append(Mark(ts, "restart", "restart"))
        elif kind == "replace" and event.get("rank") in lanes:
            _replace(lanes[event["rank"]], event, ts, marks)
        elif kind == "replaced":
            marks.append(Mark(ts, "replaced", f"rank {event.get('rank')} holds the state: "
                              f"generation {event.get('generation')} resumes at step "
                              f"{event.get('step')} with rank {event.get('source')}'s "
                              f"({event.get('nbytes')} bytes), {event.get('since_fault_s')} s "
                              "after the fault", event.get("rank")))
    for rank, lane in lanes.items():
        kept = recent.get(rank)
        if kept is not None:
            lane.spans = [Span(op.t_enter, op.t_done, op.label, op.op,
                               asynchronous=op.asynchronous, t_started=op.t_started,
                               nbytes=op.bytes) for op in kept.ops]
            lane.earlier = kept.earlier
    _merge_exits(marks)
    ends = [lane.t_end for lane in lanes.values() if lane.t_end is not None]
    ends += [m.t for m in marks] + [s.t1 or s.t0 for lane in lanes.values() for s in lane.spans]
    section.t_end = max(ends, default=last_ts)
    if any(lane.t_end is None for lane in lanes.values()):
        section.t_end = max(section.t_end, last_ts)
    section.lanes = [lanes[rank] for rank in sorted(lanes)]
    marks.sort(key=lambda mark: mark.t)
    return section


def _replace(lane: Lane, event: dict[str, Any], ts: float, marks: list[Mark]) -> None:
    """A rank replaced in place (``--recovery in-place``): its lane goes on in the new process,
    and a flag says how the old one ended and what took its place."""
    how = "a warm spare" if event.get("warm") else "a new process"
    lane.title = f"rank {lane.key} (pid {event.get('old_pid')}, then {event.get('new_pid')})"
    marks.append(Mark(ts, "replace", f"rank {lane.key} replaced by {how} (pid "
                      f"{event.get('new_pid')}): the old one {event.get('old_ending')}; "
                      f"cause: {event.get('cause')}", lane.key))


def _ranks(ranks: Any) -> str:
    """``ranks 0,1`` for a list of ranks (anything else as it is)."""
    if isinstance(ranks, list):
        return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))
    return f"ranks {ranks}"


def _merge_exits(marks: list[Mark]) -> None:
    """Rank exits seen in the same moment (the launcher reads them together) become one mark:
    ``exits: rank 0 victim, rank 2 hung``."""
    exits = [m for m in marks if m.kind == "exit"]
    merged: list[list[Mark]] = []
    for mark in sorted(exits, key=lambda m: m.t):
        if merged and mark.t - merged[-1][0].t <= _SAME_MOMENT_S:
            merged[-1].append(mark)
        else:
            merged.append([mark])
    marks[:] = [m for m in marks if m.kind != "exit"]
    for group in merged:
        if len(group) == 1:
            marks.append(group[0])
        else:
            marks.append(Mark(group[0].t, "exit", "exits: " + ", ".join(
                m.text.replace(" exits:", "") for m in group)))


def _stacks_by_place(stacks: Any, ranks: list[int]) -> list[str]:
    """The grouped-stacks lines of a journal's ``stacks`` field (rank -> file)."""
    if not isinstance(stacks, dict):
        return []
    dumps = {}
    for rank, path in stacks.items():
        if not str(rank).isdigit():
            continue  # not a rank: not a field rankguard wrote
        text = stack_summary.last_dump(str(path)) if os.path.isfile(str(path)) else ""
        if text:
            dumps[int(rank)] = text
    return stack_summary.describe(stack_summary.by_stack(dumps, ranks), "") if dumps else []


def of_pool(events: Iterable[dict[str, Any]]) -> Timeline:
    """A Pool's journal (``rankguard serve --journal``): a lane per group, from its start to
    its retirement, with the calls it served, its faults, suspicions and the pool's heals."""
    events = list(events)
    pool_id = next((e.get("run_id", "") for e in events), "")
    start = events[0]["ts"] if events else 0.0
    last = events[-1]["ts"] if events else 0.0
    lanes: dict[int, Lane] = {}
    marks: list[Mark] = []
    stacks: list[str] = []  # the latest grouped stacks a fault left
    faults = 0
    for event in events:
        kind, ts, group = event["event"], event["ts"], event.get("group")
        if isinstance(group, bool) or not isinstance(group, int):
            group = None
        if kind == "group_start" and group is not None:
            devices = event.get("devices")
            where = f" ({', '.join(map(str, devices))})" if isinstance(devices, list) and \
                devices else ""
            lanes[group] = Lane(group, f"group {group}{where}", ts)
        elif group is not None and group in lanes:
            lane = lanes[group]
            took = files.finite(event.get("took_s"))
            if kind == "request" and took is not None and 0 <= took <= ts - start:
                lane.spans.append(Span(ts - took, ts, f"a call, {took:.3f} s", "request", True))
            elif kind == "group_ready":
                marks.append(Mark(ts, "ready", f"group {group} {event.get('role')} in "
                                  f"{event.get('took_s')} s" + _parts(event.get("parts")),
                                  group))
            elif kind == "request_fault":
                faults += 1
                marks.append(Mark(ts, "fault", f"group {group}: {event.get('cause')} of rank "
                                  f"{event.get('rank')}: {event.get('detail')}", group))
            elif kind == "group_suspect":
                marks.append(Mark(ts, "suspect", f"group {group} suspect after "
                                  f"{event.get('running_s')} s", group))
            elif kind == "group_retire":
                healed_in_place = bool(event.get("kept"))  # ranks kept: it goes on
                if not healed_in_place:
                    lane.t_end, lane.outcome = ts, f"retired ({event.get('action')})"
                marks.append(Mark(ts, "retire", f"group {group} retired: {event.get('reason')}"
                                  + (f" ({event.get('action')}, ranks {event.get('ranks')} "
                                     f"replaced)" if event.get("ranks") and healed_in_place
                                     else ""), group))
            elif kind == "group_start_failed":
                lane.t_end, lane.outcome = ts, "failed to start"
                marks.append(Mark(ts, "fault", f"group {group} failed to start: "
                                  f"{event.get('detail')}", group))
        elif kind == "heal":
            marks.append(Mark(ts, "heal", f"healed in {event.get('took_s')} s "
                              f"({event.get('healthy')} healthy)"))
        if kind == "stacks" and isinstance(event.get("grouped"), list):
            grouped = [str(line) for line in event["grouped"]]
            if grouped:
                stacks = [f"group {group}, +{ts - start:.3f} s:", *grouped]
    closed = any(e["event"] == "pool_close" for e in events)
    for lane in lanes.values():
        if lane.t_end is None and closed:
            lane.t_end, lane.outcome = last, "closed"
    section = Section(f"pool {pool_id}", start, last, [lanes[g] for g in sorted(lanes)],
                      sorted(marks, key=lambda mark: mark.t), stacks=stacks)
    summary = f"{len(lanes)} group(s) started, {faults} request fault(s)" + \
        ("; closed" if closed else "; still open")
    return Timeline(f"pool {pool_id}", summary, [section])


def _parts(parts: Any) -> str:
    """A heal's seconds per step (``group_ready``'s ``parts``), in words; "" without them."""
    if not isinstance(parts, Mapping) or not parts:
        return ""
    shown = [f"{name} {took:.3f} s" for name, took in parts.items()
             if isinstance(took, (int, float)) and not isinstance(took, bool)]
    return f" ({', '.join(shown)})" if shown else ""
