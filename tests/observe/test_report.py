"""``rankguard report``: the timeline's rules over a plain journal, the page it renders, and the
real thing: a run whose rank hangs, reported, and the page shown in a real headless Chromium
(lanes laid out, the never-completed operation drawn, the verdict on screen)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rankguard import cli
from rankguard.records import recent_file
from rankguard.observe import flight_recorder, report, timeline

from ..conftest import ROOT, script, text_now
from . import browser, fr_dumps

T = 1_800_000_000.0  # a wall-clock time


def _op(n: int, seq: int, t0: float, t1: float | None, op: str = "all_reduce"
        ) -> recent_file.Op:
    return recent_file.Op(n, op, seq, True, "ab", (0, 1), T + t0, None if t1 is None else T + t1)


HUNG_RUN = [
    {"event": "run_start", "ts": T, "run_id": "r<1>"},
    {"event": "attempt_start", "ts": T + 0.1, "attempt": 0},
    {"event": "rank_start", "ts": T + 0.1, "attempt": 0, "rank": 0, "pid": 10},
    {"event": "rank_start", "ts": T + 0.1, "attempt": 0, "rank": 1, "pid": 11},
    {"event": "first_step", "ts": T + 2.0, "attempt": 0},
    {"event": "hang_detected", "ts": T + 6.0, "attempt": 0, "blamed": [1], "op": "all_reduce",
     "seq": 3, "reason": "no_progress", "group": "world", "stacks": {},
     "verdict": "rank 1 never reached all_reduce #3 (made no progress); rank 0 waited 3.0 s"},
    {"event": "escalate", "ts": T + 6.0, "attempt": 0, "step": "term", "ranks": [0, 1],
     "reason": "hung"},
    {"event": "rank_exit", "ts": T + 6.2, "attempt": 0, "rank": 0, "outcome": "victim"},
    {"event": "rank_exit", "ts": T + 6.21, "attempt": 0, "rank": 1, "outcome": "hung"},
    {"event": "attempt_end", "ts": T + 6.3, "attempt": 0, "fault": "hung", "rank": 1,
     "at": T + 3.0, "root_cause": "hang: rank 1 never reached all_reduce #3"},
    {"event": "restart", "ts": T + 6.4, "attempt": 1, "root_cause": "hang"},
    {"event": "attempt_start", "ts": T + 6.5, "attempt": 1},
    {"event": "rank_start", "ts": T + 6.5, "attempt": 1, "rank": 0, "pid": 20},
    {"event": "run_end", "ts": T + 9.0, "status": "failed", "exit_code": 3,
     "root_cause": "hang: rank 1 never reached all_reduce #3"},
]
RECENT = {0: {
    0: recent_file.RankRecent(0, 0, 10, (_op(2, 1, 2.0, 2.5), _op(3, 2, 2.5, 2.9),
                                         _op(4, 3, 3.0, None)), earlier=True),
    1: recent_file.RankRecent(1, 0, 11, (_op(2, 1, 2.0, 2.5), _op(3, 2, 2.5, 2.9)))}}


def test_a_run_becomes_a_section_per_attempt_with_lanes_ops_and_moments() -> None:
    view = timeline.of_run(HUNG_RUN, RECENT)
    assert view.title == "run r<1>" and view.summary.startswith("failed, exit code 3; root ")
    first, second = view.sections
    assert [lane.title for lane in first.lanes] == ["rank 0 (pid 10)", "rank 1 (pid 11)"]
    assert [lane.outcome for lane in first.lanes] == ["victim", "hung"]
    assert first.lanes[0].spans[-1] == timeline.Span(T + 3.0, None, "all_reduce #3",
                                                     "all_reduce")
    assert first.lanes[0].earlier and not first.lanes[1].earlier
    assert first.verdict == HUNG_RUN[5]["verdict"]
    assert first.cause == "hang: rank 1 never reached all_reduce #3"
    kinds = [(mark.kind, round(mark.t - T, 2)) for mark in first.marks]
    assert kinds == [("first_step", 2.0), ("fault", 3.0), ("verdict", 6.0), ("escalate", 6.0),
                     ("exit", 6.2), ("restart", 6.4)], kinds
    assert first.marks[4].text == "exits: rank 0 victim, rank 1 hung"  # one moment, one mark
    assert [lane.title for lane in second.lanes] == ["rank 0 (pid 20)"]
    assert second.lanes[0].spans == [] and second.lanes[0].t_end is None


def test_an_injected_fault_that_never_fired_is_a_flag_of_its_attempt() -> None:
    message = "injection kill:rank=1,at=step9 never fired (in attempt 1, rank 1 reached step 4)"
    events = [*HUNG_RUN[:-1],
              {"event": "injection_never_fired", "ts": T + 8.9, "attempt": 1, "rank": 1,
               "injection": "kill:rank=1,at=step9", "message": message}, HUNG_RUN[-1]]
    second = timeline.of_run(events, RECENT).sections[1]
    assert [(m.kind, m.text) for m in second.marks if m.kind == "injection"] == [
        ("injection", message)]
    assert message in report.render(timeline.of_run(events, RECENT))


def test_the_page_draws_every_lane_and_operation_and_escapes_what_it_shows() -> None:
    page = report.render(timeline.of_run(HUNG_RUN, RECENT))
    main = "".join(re.findall(r'<svg class="timeline" .*?</svg>', page))  # not the zoomed ones
    assert main.count('class="lane"') == 3
    assert main.count('class="op"') == 4 and main.count('class="op open"') == 1
    zoomed = re.findall(r'<svg class="timeline zoom" .*?</svg>', page)
    assert len(zoomed) == 1  # attempt 0's start-up is most of it: drawn again from op 1
    assert "all_reduce #3: entered at +2.900 s, never seen completed" in zoomed[0]
    assert "r&lt;1&gt;" in page and "r<1>" not in page
    assert "rank 1 never reached all_reduce #3 (made no progress)" in page
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # self-contained


def test_a_pool_journal_becomes_lanes_per_group_with_faults_and_heals() -> None:
    events = [
        {"event": "pool_start", "ts": T, "run_id": "pool-1"},
        {"event": "group_start", "ts": T + 0.1, "group": 0, "pids": [1, 2]},
        {"event": "group_ready", "ts": T + 1.0, "group": 0, "role": "started", "took_s": 0.9},
        {"event": "group_start", "ts": T + 1.1, "group": 1, "pids": [3, 4]},
        {"event": "request", "ts": T + 1.5, "group": 0, "took_s": 0.3},
        {"event": "request", "ts": T + 1.6, "group": 0, "took_s": 1e9},  # longer than the pool
        {"event": "request_fault", "ts": T + 2.0, "group": 0, "rank": 1, "cause": "crashed",
         "detail": "exit code 3"},
        {"event": "group_retire", "ts": T + 2.1, "group": 0, "action": "kill",
         "reason": "crashed"},
        {"event": "heal", "ts": T + 2.5, "healthy": 1, "took_s": 0.5},
        {"event": "pool_close", "ts": T + 3.0, "groups": 1},
    ]
    view = timeline.of_pool(events)
    (section,) = view.sections
    assert [(lane.title, lane.outcome) for lane in section.lanes] == [
        ("group 0", "retired (kill)"), ("group 1", "closed")]
    assert [mark.kind for mark in section.marks] == ["ready", "fault", "retire", "heal"]
    assert section.lanes[0].spans == [timeline.Span(T + 1.2, T + 1.5, "a call, 0.300 s",
                                                    "request", True)]
    assert view.summary == "2 group(s) started, 1 request fault(s); closed"


def test_a_replica_whose_rank_was_replaced_goes_on_in_its_lane_with_the_heals_parts() -> None:
    events = [
        {"event": "pool_start", "ts": T, "run_id": "pool-2"},
        {"event": "group_start", "ts": T + 0.1, "group": 1, "pids": [1, 2],
         "devices": ["cuda:0", "cuda:1"]},
        {"event": "request_fault", "ts": T + 2.0, "group": 1, "rank": 1,
         "cause": "signalled", "detail": "was killed by SIGKILL during the request"},
        {"event": "group_retire", "ts": T + 2.0, "group": 1, "action": "replace",
         "reason": "signalled", "ranks": [1], "kept": [0]},
        {"event": "ranks_replace", "ts": T + 2.0, "group": 1, "ranks": [1]},
        {"event": "group_ready", "ts": T + 2.6, "group": 1, "role": "ranks_replaced",
         "ranks": [1], "took_s": 0.6, "parts": {"stop": 0.01, "rank1_group": 0.5}},
        {"event": "pool_close", "ts": T + 3.0, "groups": 1},
    ]
    (section,) = timeline.of_pool(events).sections
    assert [(lane.title, lane.outcome) for lane in section.lanes] == [
        ("group 1 (cuda:0, cuda:1)", "closed")]
    retire, ready = (m for m in section.marks if m.kind in ("retire", "ready"))
    assert retire.text == "group 1 retired: signalled (replace, ranks [1] replaced)"
    assert ready.text == ("group 1 ranks_replaced in 0.6 s (stop 0.010 s, "
                          "rank1_group 0.500 s)")


def test_flight_recorder_dumps_map_each_kept_collective_and_leave_out_what_torch_cannot_match(
        ) -> None:
    ops = (_op(1, 0, 0.0, 0.1, "init_process_group"), _op(2, 1, 0.1, 0.2, "all_gather"),
           _op(3, 1, 0.2, None, "send"),
           recent_file.Op(4, "barrier", 1, False, "cd", (0, 2), T + 0.3, None))
    dump = flight_recorder.dump(recent_file.RankRecent(0, 0, 10, ops), 4)
    assert dump["version"] == flight_recorder.VERSION
    assert [(e["record_id"], e["profiling_name"], e["collective_seq_id"], e["state"],
             e["process_group"]) for e in dump["entries"]] == [
        (1, "gloo:all_gather", 1, "completed", ("world", "default_pg")),
        (3, "gloo:barrier", 1, "started", ("cd", "ranks 0,2"))]
    gather = dump["entries"][0]
    assert gather["output_sizes"] == [[4]] and gather["input_sizes"] == [[]]
    assert gather["time_discovered_completed_ns"] == int((T + 0.2) * 1e9)
    assert dump["pg_config"] == {
        "world": {"name": "world", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
        "cd": {"name": "cd", "desc": "ranks 0,2", "ranks": "[0, 2]"}}



# the names torch 2.11's analyser (the GPU machine's) takes: its Op asserts that the library is
# nccl or xccl, and the name one of these (no "barrier", no "all_to_all_single")
TORCH_2_11_COLLECTIVES = {
    "broadcast", "_broadcast_oop", "reduce", "_reduce_oop", "all_gather", "all_reduce",
    "_all_gather_base", "all_gather_into_tensor_coalesced", "reduce_scatter",
    "reduce_scatter_tensor_coalesced", "_reduce_scatter_base", "gather", "scatter", "all_to_all",
    "all_reduce_barrier", "allreduce_coalesced", "ALLGATHER_coalesced",
    "REDUCE_SCATTER_coalesced"}


def test_an_nccl_groups_dump_names_its_operations_as_nccl_and_torch_2_11s_analyser_takes():
    kinds = [kind for kind, name in flight_recorder.TORCH_NAMES.items() if name]
    ops = tuple(recent_file.Op(n, kind, 1, True, "ab", (0, 1), T + n, T + n + 0.1, "completed")
                for n, kind in enumerate(kinds, 1))
    names = [e["profiling_name"].split(":") for e in
             flight_recorder.dump(recent_file.RankRecent(0, 0, 10, ops), 2)["entries"]]
    assert len(names) == len(kinds)
    assert {library for library, _ in names} == {"nccl"}
    assert {name for _, name in names} <= TORCH_2_11_COLLECTIVES, names
    assert ["nccl", "all_reduce_barrier"] in names  # ProcessGroupNCCL's name of a barrier


def _ring(rank: int, *ops: tuple[str, int, float, float | None]) -> recent_file.RankRecent:
    """Rank ``rank``'s world ops: (kind, seq, entered, seen completed)."""
    return recent_file.RankRecent(rank, 0, 10 + rank, tuple(
        recent_file.Op(seq + 1, kind, seq, True, "ab", (0, 1, 2), T + t0,
                       None if t1 is None else T + t1) for kind, seq, t0, t1 in ops))


SETTLED = {
    "a killed rank's last collectives, completed by another rank that went on, are completed "
    "when the first such rank saw them": (
        {0: _ring(0, ("all_reduce", 1, 1.0, 1.5), ("all_reduce", 2, 2.0, 2.5),
                  ("all_reduce", 3, 3.0, None)),
         1: _ring(1, ("all_reduce", 1, 1.1, None), ("all_reduce", 2, 2.1, None)),
         2: _ring(2, ("all_reduce", 1, 1.0, 1.4), ("all_reduce", 2, 2.0, 2.6),
                  ("all_reduce", 3, 3.0, None))},
        {1: [1.4, 2.5]}),
    "a rank that entered the collective after another saw it done is done when it entered": (
        {0: _ring(0, ("all_reduce", 1, 1.0, 1.5), ("all_reduce", 2, 2.0, None)),
         1: _ring(1, ("all_reduce", 1, 1.7, None))},
        {1: [1.7]}),
    "a collective no other rank went past stays started (its completion may be a failure)": (
        {0: _ring(0, ("all_reduce", 1, 1.0, 1.5)), 1: _ring(1, ("all_reduce", 1, 1.0, None))},
        {1: [None]}),
    "a broadcast stays started: its root completes it before the others receive": (
        {0: _ring(0, ("broadcast", 1, 1.0, 1.5), ("all_reduce", 2, 2.0, None)),
         1: _ring(1, ("broadcast", 1, 1.0, None))},
        {1: [None]}),
    "a rank's own later operation is no proof for itself": (
        {0: _ring(0, ("all_reduce", 1, 1.0, None), ("all_reduce", 2, 2.0, 2.5))},
        {0: [None, 2.5]}),
}


@pytest.mark.parametrize("case", SETTLED)
def test_flight_recorder_completes_what_the_group_proves_and_the_ledger_had_not_recorded(
        case: str) -> None:
    recent, expected = SETTLED[case]
    proven = flight_recorder.with_proven_completions(recent)
    for rank, times in expected.items():
        assert [None if op.t_done is None else round(op.t_done - T, 6)
                for op in proven[rank].ops] == times, case
    assert {rank: [op.t_enter for op in kept.ops] for rank, kept in proven.items()} == {
        rank: [op.t_enter for op in kept.ops] for rank, kept in recent.items()}


def _await_event(log: Path, event: str, timeout: float) -> None:
    import time as clock

    until = clock.monotonic() + timeout
    while f'"event": "{event}"' not in text_now(log):
        assert clock.monotonic() < until, f"no {event} event in {timeout} s:\n{text_now(log)}"
        clock.sleep(0.1)


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rankguard.cli", "report", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_bad_input_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    missing = _report(str(tmp_path / "nothing"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert "no run's journal" in missing.stderr
    (tmp_path / "journal.jsonl").write_text(json.dumps(HUNG_RUN[0]) + "\n")
    unwritable = _report(str(tmp_path), "-o", str(tmp_path / "no" / "such" / "report.html"))
    assert unwritable.returncode == 2 and "give another file" in unwritable.stderr
    assert "Traceback" not in missing.stderr + unwritable.stderr


@pytest.mark.slow
@pytest.mark.deadline(150)
def test_a_hung_runs_report_shows_its_lanes_the_open_operation_and_the_verdict_in_chromium(
        tmp_path: Path, run_rankguard) -> None:
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "2",
                         "--inject", "hang:rank=1,at=op8", "examples/train.py", "--steps", "30"],
                        timeout=90)
    assert run.code == 3, run.stderr[-3000:]
    verdict = run.event("hang_detected")["verdict"]
    assert f"verdict: {verdict}" in run.stdout + run.stderr  # the summary says the same
    made = _report(str(run.log_dir))
    assert made.returncode == 0, made.stderr
    page = run.log_dir / "report.html"
    assert f"wrote {page}" in made.stdout
    kept = recent_file.read_attempt(str(run.log_dir / "attempt0"))
    assert sorted(kept) == [0, 1]
    # rank 0 entered the operation rank 1 never reached, and it never completed
    assert kept[0].ops[-1].t_done is None and kept[0].ops[-1].label in verdict
    with browser.chromium() as chrome:
        chrome.open(page.as_uri())
        seen = chrome.run("""
            const box = e => e.getBoundingClientRect();
            const lanes = [...document.querySelectorAll('svg.timeline:not(.zoom) g.lane')];
            return {
              lanes: lanes.map(l => [l.dataset.lane, l.dataset.outcome, box(l).height]),
              bars: [...document.querySelectorAll('rect.op')].map(r => box(r).width),
              open: [...document.querySelectorAll('svg.timeline:not(.zoom) rect.op.open')].map(
                  r => [r.closest('g.lane').dataset.lane, r.querySelector('title').textContent]),
              verdict: document.querySelector('p.verdict').innerText,
              shown: box(document.querySelector('p.verdict')).height > 0,
              flags: document.querySelectorAll('svg.timeline:not(.zoom) g.flag').length,
            };""")
        chrome.screenshot(str(tmp_path / "report.png"))
    assert [(lane, outcome) for lane, outcome, _ in seen["lanes"]] == [("0", "victim"),
                                                                      ("1", "hung")], seen
    assert all(height > 0 for _, _, height in seen["lanes"])
    assert len(seen["bars"]) >= 8 and all(width > 0 for width in seen["bars"])
    ((lane, title),) = seen["open"]
    assert lane == "0" and title.startswith(f"{kept[0].ops[-1].label}: entered at +"), seen
    assert title.endswith(", never seen completed"), seen
    assert seen["verdict"] == verdict and seen["shown"]
    assert seen["flags"] >= 3  # the fault, the verdict, the teardown
    assert (tmp_path / "report.png").stat().st_size > 10_000
    # torch's own trace analyser, on the Flight Recorder dumps, names the same rank and operation
    found = fr_dumps.analyse(run.log_dir, tmp_path / "fr")
    seq = run.event("hang_detected")["seq"]
    assert f"Not all ranks joining collective, sequence number: {seq}" in found, found[-3000:]
    assert "missing ranks: {1}" in found and "has errors" not in found, found[-3000:]


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_a_sigkilled_ranks_dumps_give_torchs_analyser_only_the_missing_rank(
        tmp_path: Path, run_rankguard) -> None:
    """The killed rank never recorded its last completions; its peers prove them, so the
    analyser finds no state mismatch before the collective the rank never reached."""
    run = run_rankguard(["--nproc-per-node", "4", "--hang-timeout", "3",
                         "--inject", "kill:rank=1,at=op30", script("allreduce.py"), "60"],
                        timeout=90)
    assert run.code == 1 and "rank 1 was killed by SIGKILL" in run.stderr, run.stderr[-3000:]
    found = fr_dumps.analyse(run.log_dir, tmp_path / "fr")
    assert "Not all ranks joining collective, sequence number: 30" in found, found[-3000:]
    assert "missing ranks: {1}" in found, found[-3000:]
    assert "has errors" not in found and "MISMATCH" not in found, found[-3000:]


def _journal(folder: Path, lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "journal.jsonl").write_text("".join(line + "\n" for line in lines))
    return folder


def _hung_journal_lines() -> list[str]:
    return [json.dumps(event) for event in HUNG_RUN]


def test_hostile_or_damaged_journals_give_a_report_or_one_line_never_a_traceback(
        tmp_path: Path) -> None:
    """Lines that are not events as rankguard writes them are skipped: not JSON, not objects,
    nested past the parser's depth, invalid UTF-8, an infinite time, a rank that is markup."""
    script = '"></g><script>alert(1)</script><g x="'
    hostile = _hung_journal_lines() + [
        "[1, 2]", "{}", '{"event": "rank_start", "ts": Infinity, "attempt": 1, "rank": 5}',
        "[" * 100000 + "]" * 100000, '{"event": "attempt_start", "ts": 1, "attempt": "zero"}',
        json.dumps({"event": "rank_start", "ts": T + 7, "attempt": 1, "rank": script,
                    "pid": 1}),
        json.dumps({"event": "stacks", "ts": T + 7, "attempt": 1,
                    "stacks": {"abc": str(tmp_path / "x"), "0": "/no/such/file"}})]
    (tmp_path / "x").write_text("Current thread 0x1 (most recent call first):\n")
    folder = _journal(tmp_path / "hostile", hostile)
    with open(folder / "journal.jsonl", "ab") as journal:
        journal.write(b'\xff\xfe{"event": "x", "ts": 1}\n')
    made = _report(str(folder))
    assert made.returncode == 0, made.stderr
    page = (folder / "report.html").read_text()
    assert "<script>" not in page and page.count('class="lane"') == 3
    for name in ("status", "flight-recorder"):
        shown = subprocess.run([sys.executable, "-m", "rankguard.cli", name, str(folder)],
                               cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert "Traceback" not in shown.stderr and shown.returncode in (0, 1), shown.stderr
    empty = _report(str(_journal(tmp_path / "empty", ["{}"])))
    assert empty.returncode == 2 and "holds no event of a run" in empty.stderr


def test_an_attempt_rank_or_pid_that_is_missing_or_null_skips_its_event_never_a_traceback(
        tmp_path: Path) -> None:
    """Each field the commands index a run's attempts and ranks by, missing or null in one
    event (a journal edited by hand, or damaged): that event is skipped, the rest is shown."""
    folders = []
    for number, (kind, field) in enumerate((("attempt_start", "attempt"),
                                            ("rank_start", "rank"), ("rank_start", "pid"),
                                            ("rank_exit", "rank"), ("attempt_end", "attempt"))):
        for damage in ("missing", "null"):
            events = [dict(event) for event in HUNG_RUN]
            hit = next(e for e in events if e["event"] == kind)
            if damage == "missing":
                del hit[field]
            else:
                hit[field] = None
            folders.append(_journal(tmp_path / f"{number}{damage}",
                                    [json.dumps(event) for event in events]))
    for folder in folders:  # in this process: an exception would fail the test here
        for name in ("status", "stacks", "report", "flight-recorder"):
            assert cli.main([name, str(folder)]) in (0, 1), (folder, name)


def test_files_that_are_not_regular_files_are_refused_at_once(tmp_path: Path) -> None:
    import os

    folder = _journal(tmp_path / "run", _hung_journal_lines())
    (folder / "attempt0").mkdir()
    os.mkfifo(folder / "attempt0" / "recent_rank1.json")  # nobody ever writes to it
    os.mkfifo(tmp_path / "out.html")
    to_fifo = _report(str(folder), "-o", str(tmp_path / "out.html"))
    assert to_fifo.returncode == 2 and "is not a regular file" in to_fifo.stderr, to_fifo
    os.symlink(tmp_path / "elsewhere.html", tmp_path / "link.html")
    to_link = _report(str(folder), "-o", str(tmp_path / "link.html"))
    assert to_link.returncode == 2 and "is a symbolic link" in to_link.stderr, to_link
    assert _report(str(folder)).returncode == 0  # the FIFO among the recent files is skipped
    dumps = subprocess.run([sys.executable, "-m", "rankguard.cli", "flight-recorder",
                            str(folder), "-o", str(tmp_path / "out.html")], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert dumps.returncode in (1, 2) and "Traceback" not in dumps.stderr, dumps.stderr


def test_a_hostile_beats_field_costs_status_a_bounded_time_and_a_line(tmp_path: Path) -> None:
    import time as clock

    lines = [json.dumps(e) for e in HUNG_RUN[:5]] + [json.dumps(
        {"event": "rendezvous", "ts": T + 1, "attempt": 0, "group_rank": 0,
         "beats": {"store": "127.0.0.1:1", "prefix": "x", "nodes": 10 ** 9}})]
    started = clock.monotonic()
    shown = subprocess.run([sys.executable, "-m", "rankguard.cli", "status", "--json",
                            str(_journal(tmp_path / "run", lines))], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "not one of ours" in json.loads(shown.stdout)["nodes"]
    assert clock.monotonic() - started < 30  # bounded: no billion keys, no long wait


@pytest.mark.slow
@pytest.mark.deadline(180)
def test_a_pools_journal_becomes_a_report_with_a_lane_per_group_its_faults_and_heals(
        tmp_path: Path) -> None:
    """A real Pool: a rank exits mid-call, another call sleeps past its deadline (the culprit's
    stacks are taken, in the journal); the report draws every group the pool started, the
    faults, the heals and the stacks."""
    import rankguard
    from tests.serving import rank_functions as rf

    log = tmp_path / "journal.jsonl"
    with rankguard.Pool(2, rf.load, spares=1, timeout=2.0, journal=str(log),
                        log_dir=str(tmp_path / "logs")) as pool:
        for kind in ("exit", "sleep"):
            with pytest.raises(rankguard.RequestFailed):
                pool.run(rf.forward, 1.0, fault=(1, kind))
            assert pool.run(rf.forward, 2.0) == rf.expected(2.0, 2)
        # the hung call's heal takes the stacks after the pool's timeout (2 s) for the ranks to
        # finish it; a close before then (under load) kills the replica first, as it promises
        _await_event(log, "stacks", 30.0)
    made = _report(str(log), "-o", str(tmp_path / "pool.html"))
    assert made.returncode == 0, made.stderr
    assert "request fault(s); closed" in made.stdout
    page = (tmp_path / "pool.html").read_text()
    main = "".join(re.findall(r'<svg class="timeline" .*?</svg>', page))  # not a zoomed one
    started = [json.loads(line) for line in log.read_text().splitlines()]
    groups = {e["group"] for e in started if e["event"] == "group_start"}
    # the serving replica and its spare replica: each fault's rank was replaced in place
    assert main.count('class="lane"') == len(groups) == 2
    assert main.count('class="flag flag-fault"') == 2
    assert main.count('class="flag flag-heal"') == 2
    served = [e for e in started if e["event"] == "request"]
    assert len(served) == 2 and main.count('class="op call"') == 2  # each call that succeeded
    assert "rank 1: inject (" in page  # the hung call's ranks, grouped by stack
