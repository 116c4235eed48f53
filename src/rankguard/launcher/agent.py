"""The launcher's agent: runs attempts, watches them, tears them down, restarts, exits.

One attempt:

1. start every rank (``ranks``), then host the store (the first time) while they import torch;
2. wait on events (rank exits, output, signals to the launcher) with a tick of
   ``margins.TICK_S`` for reading ledgers (``monitor``): a death is seen within milliseconds, a
   hang within ``--hang-timeout`` plus one tick;
3. on the first fault: capture stacks, stop the ranks (``teardown``), verify nothing is left;
4. classify outcomes (``outcome``), journal them, then restart or return the exit code.

The launcher's own lines and the ranks' output reach the terminal through ``terminal``: never
blocking, never raising, whatever the reader of its stdout or stderr does.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
import traceback
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..records import ledger as _ledger
from ..records import ledger_ring, private_files, recent_file
from .. import margins
from ..processes import proctree
from ..deadline import Deadline
from ..errors import UsageError
from ..records.journal import Journal
from ..processes.proctree import MARKER
from ..supervisor import RankProcesses
from ..supervisor.guardian import Guardian
from . import early_signals, signal_order, teardown
from .config import RunConfig
from .ranks import start_attempt
from .monitor import HangMonitor, Verdict
from .in_place import InPlace
from .injections import Seen, never_fired
from .spares import Spares
from .node_link import LinkContext, NodeLink
from .outcome import (EXIT_INTERNAL, EXIT_USAGE, Fault, FaultKind, RankOutcome, RankSnapshot,
                      classify, lingering, notice_kind, restarts_after)
from . import watch_rules
from .watch_rules import Act, Decision, Look, Say, Tick
from .summary import AttemptReport, render
from .terminal import Terminal

STATUS_PERIOD_S = 1.0  # the terminal's status line is redrawn at most this often


@dataclass
class _Attempt:
    """What happened in one attempt."""

    fault: Fault | None = None
    hang: Verdict | None = None
    outcomes: list[RankOutcome] = field(default_factory=list)
    report: AttemptReport | None = None
    first_step_at: float | None = None
    refusal: str | None = None  # why its fault was not repaired in place (``--recovery in-place``)


DEATHS = (FaultKind.SIGNALLED, FaultKind.EXITED)  # a rank's process ended under it


class Agent:
    """The launcher's agent on this node: runs ``config`` to the end; ``run()`` returns the
    process exit code."""

    def __init__(self, config: RunConfig, port: int,
                 link: Callable[[LinkContext], NodeLink]) -> None:
        """``port``: the job's store port; ``link``: makes this node's link to the others
        (``node_link.OneNode`` on one node, ``node_agent.MultiNode`` with several)."""
        self.config = config
        self._port = port
        self._token = uuid.uuid4().hex
        self._journal = Journal(config.journal_path, config.run_id)
        self._terminal = Terminal(status=config.streams.any_shown(config.nproc))
        self._status_at = -math.inf  # when the status line was last drawn (monotonic)
        self._signal: int | None = None
        self._signal_at: float | None = None  # when it came (monotonic)
        self._ranks: RankProcesses | None = None  # the attempt's, once started
        self._wakeup_r, self._wakeup_w = os.pipe()
        self._arrivals = signal_order.Arrivals(self._wakeup_r, config.signals)
        self._guardian: Guardian | None = None
        self._tracking: proctree.Tracking | None = None
        self._ledger_dir = ""
        self._seen: list[Seen] = []  # each rank process's injected faults, at its end
        self._spares = Spares(config, self._token, self._port, 1 if config.in_place else None) \
            if config.spares and config.max_restarts > 0 else None
        self._in_place = InPlace(config, self._token, self._journal, self._say,
                                 self._spares.take if self._spares is not None
                                 else lambda: None) if config.in_place else None
        self._link = link(LinkContext(config, self._journal, self._say,
                                      lambda: self._signal, self._wake,
                                      self._spares, self._in_place))

    def abandon(self) -> None:
        """Undo the constructor, for a launcher that ends before :meth:`run` (a signal came
        first): its journal is closed, and removed if it is still the empty file it made."""
        self._journal.discard()

    def run(self) -> int:
        """Run every attempt; returns the exit code. An error of rankguard's own (not of a
        rank) still stops every rank, and gives ``EXIT_INTERNAL`` with the traceback saved; a
        log folder found unusable meanwhile (``LOG_DIR/attemptN`` planted as a link) stops
        them too, and gives ``EXIT_USAGE`` with one line naming it."""
        try:
            return self._run()
        except UsageError as exc:  # the log folder, found unusable meanwhile (a planted link)
            self._terminal.say(f"rankguard: error: {exc}; every rank was stopped")
            return EXIT_USAGE
        except Exception as exc:
            where = os.path.join(self.config.log_dir, "internal_error.txt")
            try:
                # 0600; a link or a file of someone else's found at the name is not written
                with open(where, "w", opener=private_files.own_opener) as f:
                    traceback.print_exc(file=f)
            except OSError:  # the log dir itself may be what broke: keep the traceback here
                self._terminal.say(traceback.format_exc().rstrip("\n"))
                where = "above"
            self._terminal.say(f"rankguard: internal error: {type(exc).__name__}: {exc}; every "
                               f"rank was stopped. Traceback: {where}")
            return EXIT_INTERNAL
        finally:
            self._terminal.flush(Deadline.after(margins.FLUSH_S))
            # the exit code is decided: a signal during the interpreter's exit, which gives the
            # signals their default action back, would kill the launcher by it instead (-2 for
            # a second Ctrl-C); an ignored one stays ignored (nothing of the job is left)
            for sig in self.config.signals:
                signal.signal(sig, signal.SIG_IGN)

    def _say(self, line: str) -> None:
        self._terminal.say(line)

    def _run(self) -> int:
        self._install_signal_handlers()
        self._start_guardian()
        # after the guardian, which must stay outside: it kills what the tracking holds
        tracking = self._tracking = proctree.Tracking(self._token, (MARKER, self._token))
        cfg = self.config
        self._journal.write("run_start", nproc=cfg.nproc, command=list(cfg.command),
                            max_restarts=cfg.max_restarts, hang_timeout=cfg.hang_timeout,
                            straggler_timeout=cfg.straggler_timeout, grace=cfg.grace,
                            master_port=self._port, log_dir=cfg.log_dir, pid=os.getpid(),
                            injections=[s.text for s in cfg.injections], **self._link.run_fields())
        reports: list[AttemptReport] = []
        restart_s: list[float] = []
        last_fault: Fault | None = None
        attempt_result = _Attempt()
        try:
            for attempt in range(cfg.max_restarts + 1):
                if attempt and self._signal is not None:  # it came while the last was stopped
                    attempt_result = _Attempt(fault=self._no_restart_for_the_signal())
                    break
                if attempt:
                    self._journal.write("restart", attempt=attempt,
                                        root_cause=last_fault.describe() if last_fault else None)
                    self._say(f"rankguard: restarting (attempt {attempt} of {cfg.max_restarts})")
                attempt_result = self._run_attempt(attempt)
                if attempt_result.report is not None:  # None: a standby node, which ran none
                    reports.append(attempt_result.report)
                if last_fault is not None and attempt_result.first_step_at is not None:
                    restart_s.append(attempt_result.first_step_at - last_fault.at)
                last_fault = attempt_result.fault
                if last_fault is None or self._final(last_fault) or \
                        attempt + 1 + self._replacements() > cfg.max_restarts:
                    break
        finally:
            if self._spares is not None:
                self._spares.close()
            tracking.close(kill=True)
            self._stop_guardian()
            self._link.leave(attempt_result.fault)
        status, code = self._link.run_status(attempt_result.fault, self._signal)
        root = next((r.root_cause for r in reports if r.root_cause), None)
        unfired = never_fired(cfg.injections, self._seen)
        for spec in unfired:
            self._journal.write("injection_never_fired", **spec.as_dict())
        # rank output first, then count what was lost
        self._terminal.end_status()
        self._terminal.out.flush(Deadline.after(margins.FLUSH_S))
        self._journal.write("run_end", status=status.split()[-1], exit_code=code,
                            root_cause=root, attempts=len(reports),
                            dropped_output=self._terminal.dropped())
        self._journal.close()
        self._say(render(cfg.run_id, status, code, reports, cfg.log_dir, cfg.journal_path,
                         restart_s, self._terminal.dropped_line(),
                         [spec.message for spec in unfired]))
        return code

    # -- one attempt -------------------------------------------------------------------------

    def _run_attempt(self, attempt: int) -> _Attempt:
        cfg = self.config
        result = _Attempt()
        spares = self._spares
        layout = self._link.join(attempt)
        if isinstance(layout, Fault):
            self._say(f"rankguard: {layout.describe()}")
            result.fault = layout
            if layout.kind != FaultKind.STANDBY_END:  # a standby ran no attempt: it reports none
                result.report = AttemptReport(attempt, [], layout.describe())
            return result
        self._layout = layout
        ranks = start_attempt(cfg, attempt, self._token, layout, self._ledger_dir,
                              spares.take if spares is not None else lambda: None,
                              self._terminal, replacing=self._link.replacing_a_node())
        self._ranks = ranks
        started = time.monotonic()
        self._journal.write("attempt_start", attempt=attempt)
        for member in ranks:
            self._journal.write("rank_start", attempt=attempt, rank=member.rank, pid=member.pid,
                                warm=member.warm)
        self._link.started(ranks)
        ranks.add_reader(self._wakeup_r, self._drain_wakeup)
        monitor = HangMonitor(layout.world, cfg.hang_timeout, cfg.straggler_timeout)
        readers = {m.rank: _ledger.LedgerReader(m.ledger_path) for m in ranks}
        for member in ranks:
            monitor.watch(member.rank, member.pid, readers[member.rank], member.started_at)
        try:
            self._watch(ranks, monitor, readers, result, started)
            result.fault, result.hang = self._link.agree_on_end(result.fault, result.hang)
            report = AttemptReport(attempt, [], None)
            teardown_at = None
            if result.fault is not None:
                report.detect_s = time.monotonic() - result.fault.at
                report.stacks = teardown.capture_stacks(ranks, monitor, stopped=False)
                culprits = set(result.hang.blamed) if result.hang else (
                    {result.fault.rank} if result.fault.rank is not None else set())
                if result.fault.kind != FaultKind.LAUNCHER_SIGNAL:
                    teardown.notify_survivors(ranks, monitor, self._journal, culprits,
                                              notice_kind(result.fault), cfg.grace,
                                              result.refusal)
                report.stacks.update(teardown.capture_stacks(ranks, monitor, stopped=True))
                if result.hang is not None:
                    self._journal_hang(attempt, result.hang, report.stacks)
                    report.verdict = result.hang.describe()
                elif report.stacks:
                    self._journal.write("stacks", attempt=attempt, stacks=report.stacks)
                if result.fault.kind != FaultKind.LAUNCHER_SIGNAL:
                    self._tell_why(ranks, culprits, notice_kind(result.fault))
                teardown_at = time.monotonic()
                teardown.stop_ranks(ranks, self._journal, cfg.grace, result.fault.kind)
                report.stop_s = time.monotonic() - result.fault.at
            ranks.drain_output(Deadline.after(margins.DRAIN_S))
        finally:
            teardown.stop_ranks(ranks, self._journal, 0.0, "launcher_exit")  # no-op when done
            ranks.close(Deadline.after(1.0))
            if self._in_place is not None:
                self._in_place.end_attempt()
        assert self._tracking is not None
        teardown.sweep(self._tracking, self._journal, attempt,
                       tuple(self._spares.pids()) if self._spares is not None else ())
        last = {rank: reader.read() for rank, reader in readers.items()}
        self._seen.extend(Seen(attempt, rank, reader.injections())
                          for rank, reader in readers.items())
        self._keep_recent(ranks, readers)
        for reader in readers.values():
            reader.close()
        result.outcomes = classify([RankSnapshot.of(m, last.get(m.rank)) for m in ranks],
                                   result.fault, result.hang, teardown_at)
        for outcome in result.outcomes:
            self._journal.write("rank_exit", attempt=attempt, **outcome.as_dict())
        report.outcomes = result.outcomes
        report.root_cause = result.fault.describe() if result.fault else None
        if result.first_step_at is not None:
            report.first_step_s = result.first_step_at - started
        self._journal.write("attempt_end", attempt=attempt, root_cause=report.root_cause,
                            fault=result.fault.kind if result.fault else None,
                            rank=result.fault.rank if result.fault else None,
                            at=round(result.fault.at + ledger_ring.wall_offset(), 6)
                            if result.fault else None)
        result.report = report
        return result

    def _journal_hang(self, attempt: int, hang: Verdict, stacks: dict[int, str]) -> None:
        self._journal.write(
            "hang_detected", attempt=attempt, blamed=list(hang.blamed),
            waiting=list(hang.waiting), op=hang.op, seq=hang.seq, waited_s=hang.waited_s,
            reason=hang.reason, stacks=stacks, group=hang.group, ops=dict(hang.ops),
            elsewhere=dict(hang.elsewhere), verdict=hang.describe())

    def _watch(self, ranks: RankProcesses, monitor: HangMonitor,
               readers: dict[int, _ledger.LedgerReader], result: _Attempt,
               started: float) -> None:
        """Handle events until every rank exited cleanly or the first fault that is not
        repaired in place (``--recovery in-place``)."""
        while True:
            self._watch_until_fault(ranks, monitor, readers, result, started)
            if result.fault is None or not self._replace_in_place(ranks, monitor, readers,
                                                                  result):
                return

    def _replace_in_place(self, ranks: RankProcesses, monitor: HangMonitor,
                          readers: dict[int, _ledger.LedgerReader], result: _Attempt) -> bool:
        """Repair ``result.fault`` by replacing its culprits, if the run's recovery mode and
        the ranks allow it (see ``in_place``); then the attempt goes on without it."""
        replacer = self._in_place
        if (replacer is None or result.fault is None
                or result.fault.kind == FaultKind.LAUNCHER_SIGNAL):
            return False  # the launcher was told to stop: nothing to repair, nor to say
        fault, hang = result.fault, result.hang
        named = set(hang.blamed) if hang is not None else (
            {fault.rank} if fault.rank is not None else set())
        left = self.config.max_restarts - ranks.number - replacer.used
        refusal, causes = replacer.refusal(fault, named, ranks, self._read_all(ranks, readers),
                                             left, self._layout.world)
        if refusal is not None:
            self._journal.write("replace_refused", attempt=ranks.number, reason=refusal,
                                cause=fault.describe())
            self._say(f"rankguard: no replacement in place: {refusal}")
            result.refusal = refusal
            # a death while a replacement joins: the root cause is the first one (a rank that
            # raised, its get_state say, or hung is a fault of its own that says more)
            first = replacer.first_repaired()
            if first is not None and first.at <= fault.at and fault.kind in DEATHS:
                result.fault, result.hang = first, None
            return False
        if hang is not None:  # its stacks: the replace event's
            self._journal_hang(ranks.number, hang, {})
        for rank in causes:
            monitor.unwatch(rank)
        for member in replacer.replace(ranks, self._layout, self._ledger_dir, fault, hang,
                                       causes):
            self._seen.append(Seen(ranks.number, member.rank, readers[member.rank].injections()))
            readers[member.rank].close()
            readers[member.rank] = _ledger.LedgerReader(member.ledger_path)
            monitor.watch(member.rank, member.pid, readers[member.rank], member.started_at)
        result.fault = result.hang = None
        return True

    def _replacements(self) -> int:
        return self._in_place.used if self._in_place is not None else 0

    def _watch_until_fault(self, ranks: RankProcesses, monitor: HangMonitor,
                           readers: dict[int, _ledger.LedgerReader], result: _Attempt,
                           started: float) -> None:
        """Handle events until every rank exited cleanly or the first fault. Each look gathers
        what it needs (exits, the node link's news, the ledgers once per tick and when ranks
        exit: every check of that moment shares them), ``watch_rules`` decides, this acts."""
        tick = Deadline.after(margins.TICK_S)
        while ranks.live() and result.fault is None:
            exited = ranks.pump(tick)
            now = time.monotonic()
            outside = self._link.outside_fault(now)
            ticked = tick.passed()
            if ticked:
                tick = Deadline.after(margins.TICK_S)
            snaps = self._read_all(ranks, readers) if (exited or ticked) and outside is None \
                else {}
            if snaps and result.first_step_at is None and self._all_stepped(snaps):
                result.first_step_at = now
                self._journal.write("first_step", attempt=ranks.number,
                                    since_start_s=round(now - started, 3))
                self._prepare_spares(ranks.number)
            for member in exited if outside is None else []:
                monitor.unwatch(member.rank)
            look = self._look(ranks, snaps, now, tuple(m.rank for m in exited), outside)
            decision, look = self._decided(watch_rules.on_events, look)
            self._act(decision, result)
            if decision.act is Act.STOP or not ticked:
                continue
            self._show_status(ranks, snaps, now)
            self._end_lingering(ranks, monitor, look, snaps)
            overdue = stopped = None
            if self._in_place is not None and self._in_place.pending:
                overdue = self._in_place.check(now, ranks)
                if overdue is None and not self._in_place.pending:
                    self._prepare_spares(ranks.number)
            if self._in_place is not None and overdue is None:
                stopped = self._in_place.stopped_survivor(now, ranks)
            verdicts: tuple[Verdict, ...] = ()
            if overdue is None:
                live = {m.rank: snaps[m.rank] for m in ranks.live()}
                verdicts = tuple(monitor.check(now, live, self._link.remote_ranks(live, now)))
            tick_look = Tick(overdue, verdicts, stopped=stopped,
                             replacing=self._in_place is not None and self._in_place.pending)
            decision, _ = self._decided(lambda seen: watch_rules.on_tick(seen, tick_look), look)
            self._act(decision, result)
        if result.fault is None:  # every rank has exited: nothing more will show
            snaps = self._read_all(ranks, readers)
            fault = watch_rules.all_exited(tuple(RankSnapshot.of(m, snaps[m.rank]) for m in ranks),
                                           self._link.cascade_window, self.config.hang_timeout)
            if fault is not None:
                result.fault = self._link.cause_once_ended(fault)
                self._say(f"rankguard: {result.fault.describe()}")

    def _look(self, ranks: RankProcesses, snaps: dict[int, _ledger.RankProgress], now: float,
              exited: tuple[int, ...], outside: Fault | None) -> Look:
        """What the loop observed at ``now``: ``snaps``, the ledgers read then (if read)."""
        return Look(now, tuple(RankSnapshot.of(m, snaps.get(m.rank)) for m in ranks),
                    frozenset(m.rank for m in ranks.live()), exited=exited, outside=outside,
                    signal=self._signal, signal_at=self._signal_at, theirs=self._link.leaves_to_others,
                    cascade_window=self._link.cascade_window,
                    hang_timeout=self.config.hang_timeout, in_place=self._in_place is not None)

    def _decided(self, decide: Callable[[Look], Decision], look: Look) -> tuple[Decision, Look]:
        """``decide(look)``, after asking the node link for the cause of the fault the ranks
        show when the decision needs it; and the look with its answer."""
        decision = decide(look)
        if decision.act is Act.ASK_CAUSE:
            assert decision.fault is not None
            look = replace(look, cause=self._link.cause_of(decision.fault, look.now))
            decision = decide(look)
        return decision, look

    def _act(self, decision: Decision, result: _Attempt) -> None:
        """Say and journal what ``decision`` reports; take its fault, if it stops the attempt."""
        for report in decision.reports:
            if isinstance(report, Say):
                self._say(report.line)
                continue
            verdict = report.verdict
            self._journal.write("straggler", ranks=list(verdict.blamed), op=verdict.op,
                                seq=verdict.seq, waited_s=verdict.waited_s,
                                waiting=list(verdict.waiting), group=verdict.group)
            self._say(f"rankguard: straggler: {verdict.describe()}; waiting up to "
                      f"--straggler-timeout {self.config.straggler_timeout:g} s")
        if decision.act is Act.STOP:
            result.fault, result.hang = decision.fault, decision.hang

    def _end_lingering(self, ranks: RankProcesses, monitor: HangMonitor, look: Look,
                       snaps: dict[int, _ledger.RankProgress]) -> None:
        """End each rank whose script ended with code 0 at least ``margins.linger_limit`` ago
        but whose process lives on (``teardown.end_lingering``: its stacks, SIGTERM, SIGKILL),
        saying where it lingered. Not a fault: the run's result stays what its scripts said
        (README, "A rank whose script ended but whose process lingers"). The loop waits for it
        (up to ``margins.STACKS_S`` + ``--grace`` + ``margins.REAP_S``)."""
        limit = margins.linger_limit(self.config.straggler_timeout)
        for state in look.ranks:
            since = lingering(state, look.now, limit) if state.rank in look.live else None
            snap = snaps.get(state.rank)
            if since is None or snap is None:
                continue
            member = ranks[state.rank]
            where, killed = teardown.end_lingering(ranks, member, snap.stacks_ready,
                                                   self.config.grace)
            monitor.unwatch(member.rank)
            self._journal.write("linger", attempt=ranks.number, rank=member.rank,
                                pid=member.pid, since_s=round(since, 3), limit_s=limit,
                                threads=where, stacks=member.stacks_path if where else None,
                                killed=killed)
            how = "SIGKILL" if killed else "SIGTERM"
            lines = [f"rankguard: rank {member.rank}'s script ended {since:.1f} s ago (exit "
                     f"code 0) but its process did not exit (--straggler-timeout {limit:g} s); "
                     f"ended it with {how}; the run's result stays its scripts'. Where it "
                     "lingered" + (":" if where else ": no stacks (it did not answer)")]
            lines += [f"  {line}" for line in where]
            self._say("\n".join(lines))

    def _show_status(self, ranks: RankProcesses, snaps: dict[int, _ledger.RankProgress],
                     now: float) -> None:
        """Redraw the terminal's status line (once per ``STATUS_PERIOD_S``): the attempt, the
        ranks running, how long ago the furthest collective began, and which it is."""
        if now - self._status_at < STATUS_PERIOD_S:
            return
        self._status_at = now
        worlds = [g for snap in snaps.values() for g in snap.groups if g.is_world and g.entered]
        attempt = f"attempt {ranks.number}"
        if self.config.max_restarts:
            attempt += f" (restarts left {self.config.max_restarts - ranks.number})"
        text = f"rankguard: {attempt} · {len(ranks.live())}/{len(ranks)} ranks running · "
        if not worlds:
            started = min((m.started_at for m in ranks), default=now)
            text += f"starting for {now - started:.0f} s"
        else:
            furthest = max(worlds, key=lambda g: g.entered)
            label = _ledger.op_label(furthest.kind, furthest.seq)
            text += f"{label}, entered {now - furthest.t_enter:.1f} s ago"
        self._terminal.status(text)

    def _keep_recent(self, ranks: RankProcesses,
                     readers: dict[int, _ledger.LedgerReader]) -> None:
        """Copy each rank's recent operations from its ledger into its attempt's folder
        (``recent_file``), for ``rankguard report`` and ``rankguard flight-recorder``."""
        offset = ledger_ring.wall_offset()
        for member in ranks:
            try:
                recent_file.write(os.path.dirname(member.log_path), member.rank, ranks.number,
                                  member.pid, readers[member.rank].recent(), offset)
            except Exception as exc:  # noqa: BLE001 (keeping them must not fail the run)
                self._say(f"rankguard: cannot keep rank {member.rank}'s recent operations: "
                          f"{type(exc).__name__}: {exc}")
                return

    @staticmethod
    def _tell_why(ranks: RankProcesses, culprits: set[int], kind: int) -> None:
        """Before the SIGTERM, tell each live rank in its ledger which rank failed (itself,
        for a culprit), so that its teardown can say why it was stopped."""
        first = min(culprits) if culprits else -1
        for member in ranks.live():
            _ledger.post_notice(member.ledger_path, kind,
                                member.rank if member.rank in culprits else first)

    def _no_restart_for_the_signal(self) -> Fault:
        """The run's end when a signal came while an attempt's ranks were being stopped after
        its fault: no restart; the exit code is the signal's, the root cause the fault's."""
        assert self._signal is not None and self._signal_at is not None  # set together
        name = proctree.signal_name(self._signal)
        self._say(f"rankguard: received {name} while the ranks were being stopped; no restart")
        return Fault(FaultKind.LAUNCHER_SIGNAL, self._signal_at, None,
                     f"the launcher received {name} before the restart")

    def _final(self, fault: Fault) -> bool:
        """Whether no restart is tried after ``fault`` (see ``outcome.restarts_after``; with
        several nodes, also how they meet)."""
        return self._link.final(fault) or not restarts_after(fault)

    def _prepare_spares(self, attempt: int) -> None:
        """Once an attempt has started well, get spares ready for its restart, if any remains."""
        if self._spares is None or attempt + self._replacements() >= self.config.max_restarts:
            return
        started = self._spares.fill()
        if started:
            self._journal.write("spares", attempt=attempt, started=started,
                                pids=self._spares.pids())

    def _read_all(self, ranks: RankProcesses,
                  readers: dict[int, _ledger.LedgerReader]) -> dict[int, _ledger.RankProgress]:
        snaps = {member.rank: readers[member.rank].read() for member in ranks}
        self._link.observed(snaps)
        return snaps

    @staticmethod
    def _all_stepped(snaps: dict[int, _ledger.RankProgress]) -> bool:
        return all(snap.groups[0].stepped for snap in snaps.values())

    # -- signals and the guardian ------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        os.set_blocking(self._wakeup_w, False)
        os.set_blocking(self._wakeup_r, False)  # read by the handlers too (signal_order)
        signal.set_wakeup_fd(self._wakeup_w)

        def on_signal(signum: int, _frame: Any) -> None:
            self._on_signal(signum)

        early_signals.release(tuple(self.config.signals))
        for sig in self.config.signals:
            signal.signal(sig, on_signal)
        first = early_signals.pending()
        if first in self.config.signals:  # it came before the agent took over: before any other
            self._signal = None
            self._on_signal(first, came_first=True)

    def _on_signal(self, signum: int, came_first: bool = False) -> None:
        """A signal handler: sets the flag the loops read (the first signal to arrive, which
        may not be the first whose handler runs: ``signal_order``) and wakes the link's waits.
        A Ctrl-C after the first signal ends the grace of this node's ranks: they are killed
        at once."""
        later = self._signal is not None
        if not later:
            self._signal_at = time.monotonic()
            # the attempt's loop says so and acts
            self._signal = signum if came_first else self._arrivals.first(signum)
            later = self._signal != signum
            self._wake()  # its wakeup byte may have been read here
        if later and signum == signal.SIGINT and self._ranks is not None:
            self._ranks.hurry()
            with contextlib.suppress(OSError):  # not the terminal's lock: it may be held here
                os.write(2, b"rankguard: second SIGINT: the ranks' grace is over; killing them "
                            b"now\n")
        self._link.interrupt()

    def _wake(self) -> None:
        """Wake the attempt's event loop (from another thread)."""
        try:
            os.write(self._wakeup_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # full: it is awake already

    def _drain_wakeup(self) -> None:
        self._arrivals.read()

    def _start_guardian(self) -> None:
        self._ledger_dir = _ledger.make_dir(self.config.run_id)  # the guardian removes it
        self._guardian = Guardian(MARKER, self._token, [self._ledger_dir])

    def _stop_guardian(self) -> None:
        if self._guardian is not None:
            self._guardian.close()
