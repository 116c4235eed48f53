"""Recovery inside the job (``rankguard run --recovery in-place``): a failed rank is replaced while
the others wait for it, and the attempt goes on.

When an attempt's fault names its culprits (a rank that died, raised, or was found hung) and
every other rank is inside ``rankguard.StepLoop.run`` in bounded mode (their ledgers say so),
the agent does not stop the attempt. For each culprit:

1. **stacks**: a live culprit (hung, or on its way out) dumps its stacks first;
2. **stop**: its process tree is SIGKILLed and reaped (a rank that raised gets
   ``EXIT_WAIT_S`` to print its traceback and leave by itself), then what it started and left
   behind (its session, what carries its rank marker: ``RankProcesses.sweep_rank``);
3. **notice**: the other ranks get a notice in their ledgers: a collective they wait in raises
   ``PeerFailed`` at once, and their loop forms a new generation that keeps the failed place
   vacant (``regroup(keep_size=True)``);
4. **replacement**: a warm spare (``spares``) becomes the rank, with ``RANKGUARD_REPLACING=1``,
   else a new process does; it joins that generation and receives the state from a peer.

The replacement writes its ``recovery_file`` once it holds the state; the agent journals
``replace`` when it starts the replacement and ``replaced`` when it holds the state. A
replacement that has not done so within ``margins.replacement_limit`` is a fault of its own,
which ends the attempt (a restart, as without this mode); one that dies on the way is replaced
in turn, while replacements remain. Each replacement counts against ``--max-restarts``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Callable

from ..records import ledger as _ledger
from .. import margins
from ..records import recovery_file
from ..deadline import Deadline
from ..processes.proctree import is_stopped
from ..records.journal import Journal
from ..supervisor import RankFiles, RankProcess, RankProcesses
from .config import RunConfig
from .monitor import Verdict
from .outcome import Fault, FaultKind, RankSnapshot, own_fault
from . import replace_rules
from .ranks import Layout, launcher_for, rank_env, recovery_path, replacement_env

EXIT_WAIT_S = 1.0  # a rank that raised prints its traceback within ms, then leaves


@dataclass
class _Pending:
    """A replacement that does not hold the state yet."""

    member: RankProcess
    attempt: int
    recovery_path: str
    fault_at: float  # monotonic: when the fault it repairs began
    deadline: Deadline
    fault: Fault | None = None  # the fault it repairs (None: a lost node's rank, adopted)
    stopped_since: float | None = None  # monotonic: since when it is seen stopped (SIGSTOP)


class InPlace:
    """The replacements of one run; see the module docstring.

    Args:
        config: the run's settings.
        token: the run's marker value (``proctree.MARKER``).
        journal: where ``replace`` and ``replaced`` go.
        say: prints a line of the launcher's.
        take_spare: a warm spare, or None when none is ready.
    """

    def __init__(self, config: RunConfig, token: str, journal: Journal,
                 say: Callable[[str], None],
                 take_spare: Callable[[], subprocess.Popen[bytes] | None]) -> None:
        self._config = config
        self._token = token
        self._journal = journal
        self._say = say
        self._take_spare = take_spare
        self._pending: dict[int, _Pending] = {}
        self._stopped: dict[int, tuple[int, float]] = {}  # survivor -> (pid, seen stopped since)
        self.used = 0  # replacements started so far, in every attempt

    def refusal(self, fault: Fault, named: set[int], ranks: RankProcesses,
                snaps: dict[int, _ledger.RankProgress], restarts_left: int,
                world: int) -> tuple[str | None, dict[int, Fault]]:
        """Why ``fault`` cannot be repaired in place (None: it can), and the ranks to replace,
        each with the fault it is replaced for: ``named`` for ``fault``, and those gone with
        it for their own (``replace_rules.culprits``); ``replace_rules`` decides over what the
        agent knows of ``ranks`` now (``snaps``: their ledgers; a replacement that holds the
        state by now is journalled ``replaced`` first, and counts as a giver)."""
        for rank in list(self._pending):
            self._take_joined(rank, time.monotonic())
        members = {m.rank: _member(m, snaps.get(m.rank), m.rank in self._pending)
                   for m in ranks}
        culprits = replace_rules.culprits(frozenset(named), members)
        causes = {rank: fault if rank in named else
                  own_fault(RankSnapshot.of(ranks[rank], snaps.get(rank))) or fault
                  for rank in culprits}
        return (replace_rules.refusal(fault.kind, culprits, members, restarts_left, world),
                causes)

    def first_repaired(self) -> Fault | None:
        """The earliest fault that a replacement still joining repairs, if any: the cause of
        an attempt that a later fault ends before it joined (the first in time)."""
        return min((p.fault for p in self._pending.values() if p.fault is not None),
                   key=lambda fault: fault.at, default=None)

    def replace(self, ranks: RankProcesses, layout: Layout, ledger_dir: str, fault: Fault,
                hang: Verdict | None, causes: dict[int, Fault]) -> list[RankProcess]:
        """Stop the ranks of ``causes``, release the others, start a replacement for each;
        returns the replacements (the agent watches them from now on). ``fault``: the one the
        agent decided (``causes``: each culprit's, as ``refusal`` gave them)."""
        culprits = set(causes)
        stacks = ranks.stacks(Deadline.after(margins.STACKS_S),
                              [r for r in sorted(culprits) if ranks[r].alive])
        self._stop(ranks, culprits, fault.kind == FaultKind.RAISED)
        # a replacement that came to hold the state since ``refusal`` looked (while the stacks
        # were taken: a stopped culprit continued for its dump may complete the generation) is
        # in the culprits' generation: it needs the notice as the other members do
        for rank in [r for r in self._pending if r not in culprits]:
            self._take_joined(rank, time.monotonic())
        kind = _ledger.NOTICE_HUNG if hang is not None else _ledger.NOTICE_DIED
        # not to a replacement still joining: it joins a generation formed after this fault
        # (its peers found the failed rank silent), and the notice would break that one; a
        # fault in its generation reaches it from its peers
        for member in ranks.live():
            if member.rank not in culprits and member.rank not in self._pending:
                _ledger.post_notice(member.ledger_path, kind, min(culprits))
        started = []
        for rank in sorted(culprits):
            old, cause = ranks[rank], causes[rank]
            member, warm, recovery_path = self._start(ranks, layout, ledger_dir, rank)
            self.used += 1
            limit = Deadline.after(margins.replacement_limit(self._config.hang_timeout))
            self._pending[rank] = _Pending(member, ranks.number, recovery_path, cause.at, limit,
                                           cause)
            self._journal.write("replace", attempt=ranks.number, rank=rank, old_pid=old.pid,
                                new_pid=member.pid, warm=warm, cause=cause.describe(),
                                old_ending=_ending(old), stacks=stacks.get(rank) is not None
                                and old.stacks_path or None)
            how = "a warm spare" if warm else "a new process"
            self._say(f"rankguard: replacing rank {rank} in place with {how} (pid "
                      f"{member.pid}); the other ranks wait for it")
            started.append(member)
        return started

    def adopt(self, member: RankProcess, attempt: int, recovery: str, fault_at: float,
              cause: str) -> None:
        """Watch ``member``, started as the replacement of a rank of a lost node (this node is
        a standby that took its place): journal ``replace``, and ``replaced`` once it holds
        the state, as for a replacement of our own."""
        limit = Deadline.after(margins.replacement_limit(self._config.hang_timeout))
        self._pending[member.rank] = _Pending(member, attempt, recovery, fault_at, limit)
        self._journal.write("replace", attempt=attempt, rank=member.rank, old_pid=None,
                            new_pid=member.pid, warm=member.warm, cause=cause,
                            old_ending="was on the lost node", stacks=None)

    def check(self, now: float, ranks: RankProcesses) -> Fault | None:
        """Journal the replacements that now hold the state; then, once a rank that was to give
        the state has exited (0 or not: the generation the replacement waits for can no
        longer form), the fault that replacement repairs, at once (its hang verdict, if one),
        so that it is the cause; else a fault for one that has been stopped (SIGSTOP) for
        ``--hang-timeout`` (frozen: it cannot join), or that passed its deadline without."""
        for rank in list(self._pending):
            self._take_joined(rank, now)
        gone = next((m for m in ranks if m.rank not in self._pending and not m.alive), None)
        if gone is not None and self._pending:
            rank, pending = min(self._pending.items())
            self._pending.clear()
            self._say(f"rankguard: rank {gone.rank} {gone.ending()} while rank {rank}'s "
                      "replacement joins: the replacement can no longer join")
            return pending.fault or Fault(
                FaultKind.REPLACE_FAILED, now, rank, f"was replaced, but rank {gone.rank} "
                f"{gone.ending()} before the replacement joined")
        for rank, pending in list(self._pending.items()):
            stopped = pending.member.alive and is_stopped(pending.member.pid)
            pending.stopped_since = (pending.stopped_since or now) if stopped else None
            if stopped and now - pending.stopped_since >= self._config.hang_timeout:
                del self._pending[rank]
                stopped_s = now - pending.stopped_since
                return Fault(FaultKind.REPLACE_FAILED, now, rank, "was replaced, but the "
                             f"replacement was stopped (SIGSTOP) for {stopped_s:.1f} s while "
                             "it joined")
            if pending.deadline.passed() and pending.member.alive:
                del self._pending[rank]
                return Fault(FaultKind.REPLACE_FAILED, now, rank, "was replaced, but the replacement "
                             f"did not join within {pending.deadline.seconds:g} s")
        return None

    def stopped_survivor(self, now: float, ranks: RankProcesses) -> Fault | None:
        """While a replacement joins, a hang fault naming the lowest live rank (not a
        replacement) seen stopped (SIGSTOP) for ``--hang-timeout``: the hang rules are off
        while the ranks wait in the regroup, and a stopped rank cannot join the generation the
        replacement waits for (its peers would give up on it only after their join timeout,
        and blame the replacement that gave up with them). None while there is none."""
        if not self._pending:
            self._stopped.clear()
            return None
        seen: dict[int, tuple[int, float]] = {}
        for member in ranks.live():
            if member.rank in self._pending or not is_stopped(member.pid):
                continue
            pid, since = self._stopped.get(member.rank, (member.pid, now))
            seen[member.rank] = (member.pid, since if pid == member.pid else now)
        self._stopped = seen
        for rank, (_, since) in sorted(seen.items()):
            if now - since >= self._config.hang_timeout:
                del self._stopped[rank]
                return Fault(FaultKind.HUNG, since, rank, f"was stopped (SIGSTOP) for "
                             f"{now - since:.1f} s while rank {min(self._pending)}'s "
                             "replacement joined: it cannot take part in the new generation")
        return None

    def _take_joined(self, rank: int, now: float) -> bool:
        """If rank's replacement holds the state (its recovery file says so): journal
        ``replaced``, stop waiting for it, and return True."""
        pending = self._pending[rank]
        joined = recovery_file.read(pending.recovery_path)
        if joined is None:
            return False
        del self._pending[rank]
        self._journal.write(
            "replaced", attempt=pending.attempt, rank=rank, pid=pending.member.pid,
            generation=joined.generation,
            step=joined.step, source=joined.source, nbytes=joined.nbytes,
            share_s=joined.share_s, held_at=joined.held_at,
            since_fault_s=round(now - pending.fault_at, 3))
        self._say(f"rankguard: rank {rank} replaced: generation {joined.generation} "
                  f"resumes at step {joined.step} with the state of rank "
                  f"{joined.source} ({joined.nbytes} bytes), {now - pending.fault_at:.2f} "
                  "s after the fault")
        return True

    def end_attempt(self) -> None:
        """Forget the replacements still joining: they belonged to the attempt that ended (its
        teardown stopped them), and their faults must not end the next attempt."""
        self._pending.clear()

    @property
    def pending(self) -> bool:
        """Whether a replacement does not hold the state yet."""
        return bool(self._pending)

    def _stop(self, ranks: RankProcesses, culprits: set[int], raised: bool) -> None:
        if raised:
            ranks.wait_exits(Deadline.after(EXIT_WAIT_S), culprits)
        live = [ranks[r] for r in culprits if ranks[r].alive]
        for member in live:
            member.killed = True
        ranks.signal(signal.SIGKILL, live)  # their trees; continued, so a stopped one dies
        ranks.wait_exits(Deadline.after(margins.REAP_S), culprits)
        for rank in culprits:  # what they started and left behind (their trees are gone)
            ranks.sweep_rank(ranks[rank])

    def _start(self, ranks: RankProcesses, layout: Layout, ledger_dir: str, rank: int
               ) -> tuple[RankProcess, bool, str]:
        old = ranks[rank]
        attempt_dir = os.path.dirname(old.log_path)
        number = self.used + 1
        files = RankFiles(log=old.log_path, stacks=old.stacks_path, ledger=os.path.join(
            ledger_dir, f"attempt{ranks.number}-rank{rank}-replacement{number}.ledger"))
        recovery = recovery_path(attempt_dir, rank, number)
        env = rank_env(self._config, rank - layout.base, ranks.number, self._token, layout,
                       files.ledger, files.stacks)
        env.update(replacement_env(recovery))
        spare = self._take_spare()
        member = ranks.replace(rank, files, env, launcher_for(self._config, spare))
        member.warm = member.proc is spare
        return member, member.warm, recovery


def _member(member: RankProcess, snap: _ledger.RankProgress | None,
            joining: bool) -> replace_rules.Member:
    flags = snap.flags if snap is not None else 0
    return replace_rules.Member(alive=member.alive, joining=joining,
                                ended_well=_ended_well(member, snap),
                                step_loop=bool(flags & _ledger.FLAG_STEP_LOOP),
                                loop_ended=bool(flags & _ledger.FLAG_STEP_LOOP_ENDED),
                                bounded=bool(flags & _ledger.FLAG_BOUNDED))


def _ended_well(member: RankProcess, snap: _ledger.RankProgress | None) -> bool:
    """Whether ``member`` left with exit code 0 (its script ended), or is leaving so: gone with
    no fault of its own (``outcome.own_fault``)."""
    if not member.alive:
        return own_fault(RankSnapshot.of(member, snap)) is None
    return snap is not None and snap.fault == _ledger.FAULT_EXITING and snap.exit_code == 0


def _ending(old: RankProcess) -> str:
    """How the replaced process ended: by itself, or stopped by the launcher (a rank found
    hung, or one that raised and did not exit within ``EXIT_WAIT_S``)."""
    ending = old.ending()
    return f"stopped by the launcher ({ending})" if old.killed else ending
