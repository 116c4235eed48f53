"""A timeline (``observe.timeline``) as one self-contained HTML page: inline CSS and SVG, no
script and nothing fetched at view time. Pure: ``render`` returns the page's text.

Each section (an attempt, or a pool's life) is drawn as lanes on one time axis: an operation is
a tick where its rank entered it (a red bar to the lane's end if it was never seen completed), a
lane ends where its process exited, and the run's moments are numbered flags across the lanes,
listed under the drawing with their times. Hovering a tick, a bar or a flag shows what it is
(SVG ``title``).
"""

from __future__ import annotations

import dataclasses
import html
import math
import time

from .timeline import Lane, Mark, Section, Span, Timeline

WIDTH = 1100  # the drawing's width, in CSS pixels
LABEL_W = 190  # the lane titles' column
RIGHT_W = 110  # the outcomes' column
LANE_H = 26
FLAG_GAP = 14  # flags closer than this (pixels) are drawn one under the other
ZOOM_SHARE = 0.3  # start-up longer than this share of an attempt: drawn again without it
AXIS_H = 34
OP_COLORS = {"all_reduce": "#4e79a7", "broadcast": "#59a14f", "all_gather": "#76b7b2",
             "barrier": "#b07aa1", "reduce_scatter": "#edc948", "send": "#9c755f",
             "recv": "#9c755f", "init_process_group": "#bab0ac", "shutdown": "#bab0ac",
             "request": "#4e79a7"}
OTHER_OP = "#8cd17d"
MARK_COLORS = {"fault": "#d62728", "verdict": "#d62728", "escalate": "#ff7f0e",
               "restart": "#1f77b4", "spares": "#17becf", "first_step": "#2ca02c",
               "straggler": "#e377c2", "exit": "#7f7f7f", "replace": "#ff7f0e",
               "replaced": "#2ca02c", "suspect": "#ff7f0e", "injection": "#bcbd22",
               "heal": "#2ca02c", "retire": "#d62728", "ready": "#2ca02c"}
_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 28px 0 4px; }
.summary { margin: 0 0 12px; } .cause { color: #b00; font-weight: 600; }
.verdict { color: #b00; } .legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px;
            vertical-align: -1px; }
ol.marks { margin: 6px 0; padding-left: 28px; } ol.marks li { margin: 1px 0; }
pre.stacks { background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 12px; }
svg text { font: 12px system-ui, sans-serif; } .axis text { fill: #555; font-size: 11px; }
"""


def render(timeline: Timeline) -> str:
    """The page for ``timeline``."""
    body = [f"<h1>rankguard: {_e(timeline.title)}</h1>",
            f'<p class="summary">{_e(timeline.summary)}</p>', _legend()]
    for section in timeline.sections:
        body.extend(_section(section))
    made = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    body.append(f'<p class="made">made by rankguard report, {made}</p>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>rankguard: {_e(timeline.title)}</title><style>{_CSS}</style></head>"
            "<body>\n" + "\n".join(body) + "\n</body></html>\n")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _legend() -> str:
    ops = [("all_reduce", OP_COLORS["all_reduce"]), ("broadcast", OP_COLORS["broadcast"]),
           ("all_gather", OP_COLORS["all_gather"]), ("barrier", OP_COLORS["barrier"]),
           ("other", OTHER_OP), ("never seen completed", "#d62728")]
    return '<p class="legend">' + "".join(
        f'<span><i style="background:{color}"></i>{_e(name)}</span>' for name, color in ops
    ) + "</p>"


def _section(section: Section) -> list[str]:
    out = [f'<section class="attempt" data-title="{_e(section.title)}">',
           f"<h2>{_e(section.title)}</h2>"]
    if section.cause:
        out.append(f'<p class="cause">root cause: {_e(section.cause)}</p>')
    if section.verdict:
        out.append(f'<p class="verdict">{_e(section.verdict)}</p>')
    out.append(_drawing(section, section.t_start))
    zoomed = _from_first_collective(section)
    if zoomed is not None:
        since = zoomed.t_start - section.t_start
        first = "call" if any(s.timed for lane in section.lanes for s in lane.spans) \
            else "collective"
        out.append(f'<p class="zoom">from the first {first} on, +{since:.3f} s (before it: '
                   "the ranks' start-up):</p>")
        out.append(_drawing(zoomed, section.t_start, zoom=True))
    if section.marks:
        out.append('<ol class="marks">' + "".join(
            f'<li class="mark-{_e(m.kind)}">+{m.t - section.t_start:.3f} s: {_e(m.text)}</li>'
            for m in section.marks) + "</ol>")
    if section.stacks:
        out.append("<p>where each rank was, grouped by identical stack:</p>"
                   f'<pre class="stacks">{_e(chr(10).join(section.stacks))}</pre>')
    out.append("</section>")
    return out


def _from_first_collective(section: Section) -> Section | None:
    """The section drawn again from its first collective on, when the ranks' start-up before
    it takes most of the drawing (more than ``ZOOM_SHARE``); else None."""
    firsts = [next(s.t0 for s in lane.spans if s.op != "init_process_group")
              for lane in section.lanes if any(s.op != "init_process_group" for s in lane.spans)]
    span = section.t_end - section.t_start
    if not firsts or span <= 0 or (min(firsts) - section.t_start) / span < ZOOM_SHARE:
        return None
    start = min(firsts) - 0.02 * (section.t_end - min(firsts))
    return dataclasses.replace(section, t_start=start)


class _Scale:
    def __init__(self, t0: float, t1: float) -> None:
        self.t0 = t0
        self.span = max(t1 - t0, 1e-3)
        self.width = WIDTH - LABEL_W - RIGHT_W

    def x(self, t: float) -> float:
        return LABEL_W + min(max((t - self.t0) / self.span, 0.0), 1.0) * self.width


def _drawing(section: Section, origin: float, zoom: bool = False) -> str:
    """``section``'s lanes and flags, times in seconds since ``origin``."""
    scale = _Scale(section.t_start, section.t_end)
    height = AXIS_H + LANE_H * max(len(section.lanes), 1) + 8
    kind = "timeline zoom" if zoom else "timeline"
    parts = [f'<svg class="{kind}" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg">',
             _axis(scale, height, origin)]
    for index, lane in enumerate(section.lanes):
        parts.append(_lane(lane, AXIS_H + index * LANE_H, scale, section.t_end, origin))
    placed: list[float] = []  # the flags' x so far: a flag too close to one goes lower
    for number, mark in enumerate(section.marks, 1):
        if mark.t < section.t_start:
            continue  # before a zoomed drawing's start (listed all the same)
        x = scale.x(mark.t)
        row = sum(1 for other in placed[-3:] if abs(other - x) < FLAG_GAP)
        placed.append(x)
        parts.append(_flag(number, mark, scale, height, section, row))
    if not section.lanes:
        parts.append(f'<text x="{LABEL_W}" y="{AXIS_H + 16}">no rank started</text>')
    parts.append("</svg>")
    return "".join(parts)


def _axis(scale: _Scale, height: float, origin: float) -> str:
    """Ticks at round numbers of seconds since ``origin``."""
    step = _tick_step(scale.span)
    ticks = []
    value = math.ceil((scale.t0 - origin) / step - 1e-9) * step  # the first tick, from origin
    while value <= scale.t0 - origin + scale.span + 1e-9 and len(ticks) <= 30:
        x = scale.x(origin + value)
        ticks.append(f'<line x1="{x:.1f}" y1="{AXIS_H - 6}" x2="{x:.1f}" y2="{height - 4}" '
                     'stroke="#eee"/>'
                     f'<text x="{x:.1f}" y="{AXIS_H - 10}" text-anchor="middle">'
                     f"{round(value, 6):g} s</text>")
        value += step
    return f'<g class="axis">{"".join(ticks)}</g>'


def _tick_step(span: float) -> float:
    for step in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60,
                 120, 300, 600, 1800, 3600):
        if span / step <= 10:
            return float(step)
    return span / 10


def _lane(lane: Lane, y: float, scale: _Scale, t_end: float, origin: float) -> str:
    end = lane.t_end if lane.t_end is not None else t_end
    x0, x1 = scale.x(lane.t_start), scale.x(end)
    parts = [f'<g class="lane" data-lane="{_e(lane.key)}" data-outcome="{_e(lane.outcome)}">',
             f'<text x="6" y="{y + 17}">{_e(lane.title)}</text>',
             f'<rect class="life" x="{x0:.1f}" y="{y + 4}" width="{max(x1 - x0, 1):.1f}" '
             f'height="{LANE_H - 8}" fill="#f1f1f1"/>']
    if lane.earlier and lane.spans:
        x = scale.x(lane.spans[0].t0)
        parts.append(f'<text x="{x - 4:.1f}" y="{y + 17}" text-anchor="end" fill="#999">'
                     "&#8230;<title>older operations were not kept (the ledger keeps the "
                     "latest 512 of the world group, 32 of each other group)</title></text>")
    for span in lane.spans:
        parts.append(_bar(span, y, scale, end, origin))
    outcome = lane.outcome or ("running" if lane.t_end is None else "")
    color = "#b00" if outcome in ("hung", "crashed", "failed", "killed") else "#444"
    parts.append(f'<text x="{WIDTH - RIGHT_W + 8}" y="{y + 17}" fill="{color}">'
                 f"{_e(outcome)}</text></g>")
    return "".join(parts)


def _bar(span: Span, y: float, scale: _Scale, lane_end: float, t0: float) -> str:
    """A completed operation is a tick where it was entered (the rank learns of a completion
    only when it next looks, so the time between is no duration of the operation's); one never
    completed is a red bar from its entry to the lane's end; a pool's call, whose duration is
    known, a bar from its start to its end."""
    x0 = scale.x(span.t0)
    what = _e(_what(span, t0))
    if span.timed and span.t1 is not None:
        return (f'<rect class="op call" x="{x0:.1f}" y="{y + 6}" '
                f'width="{max(scale.x(span.t1) - x0, 2):.1f}" height="{LANE_H - 12}" '
                f'fill="{OP_COLORS["request"]}"><title>{_e(span.label)}, from '
                f"+{span.t0 - t0:.3f} s</title></rect>")
    if span.t1 is not None:
        return (f'<rect class="op" x="{x0 - 1:.1f}" y="{y + 6}" width="2" '
                f'height="{LANE_H - 12}" fill="{OP_COLORS.get(span.op, OTHER_OP)}">'
                f"<title>{what}, seen completed by +{span.t1 - t0:.3f} s</title></rect>")
    return (f'<rect class="op open" x="{x0:.1f}" y="{y + 6}" '
            f'width="{max(scale.x(lane_end) - x0, 2):.1f}" height="{LANE_H - 12}" '
            f'fill="#d62728"><title>{what}, never seen completed</title></rect>')


def _what(span: Span, t0: float) -> str:
    """``all_reduce #7: entered at +1.250 s``; an asynchronous group's operation: ``all_reduce
    #7 (4096 bytes): enqueued at +1.250 s, started on the device at +1.300 s``."""
    if not span.asynchronous:
        return f"{span.label}: entered at +{span.t0 - t0:.3f} s"
    size = f" ({span.nbytes} bytes)" if span.nbytes is not None else ""
    text = f"{span.label}{size}: enqueued at +{span.t0 - t0:.3f} s"
    if span.t_started is not None:
        text += f", started on the device at +{span.t_started - t0:.3f} s"
    return text


def _flag(number: int, mark: Mark, scale: _Scale, height: float, section: Section,
          row: int) -> str:
    x = scale.x(mark.t)
    color = MARK_COLORS.get(mark.kind, "#555")
    lanes = [lane.key for lane in section.lanes]
    if mark.lane is not None and mark.lane in lanes:
        top = AXIS_H + lanes.index(mark.lane) * LANE_H
        bottom = top + LANE_H
    else:
        top, bottom = AXIS_H - 4, height - 4
    return (f'<g class="flag flag-{_e(mark.kind)}"><line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" '
            f'y2="{bottom}" stroke="{color}" stroke-width="2" stroke-dasharray="4 2"/>'
            f'<circle cx="{x:.1f}" cy="{top + 6 + 15 * row}" r="7" fill="{color}"/>'
            f'<text x="{x:.1f}" y="{top + 10 + 15 * row}" text-anchor="middle" fill="#fff" '
            f'font-size="10">{number}</text>'
            f"<title>{number}. +{mark.t - section.t_start:.3f} s: {_e(mark.text)}</title></g>")
