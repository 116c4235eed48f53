"""Margins: the time figures that steps of one bounded operation must agree on, in one place.

Every bound of rankguard comes from what its user configures (``--hang-timeout``, ``--grace``,
a test's deadline, ``Pool(timeout)``), turned into a :class:`~rankguard.deadline.Deadline` once,
where it enters. Between the steps under that deadline rankguard needs a few margins of its
own: how long a rank gets to dump its stacks, how long before a test's deadline its ranks give
up so that their answers still arrive, how much of ``--grace`` a rank's own teardown may use.
Those that two steps (often two modules, or two processes) must agree on live here, each with
the reason for its figure and what it is derived from; a module that needs one imports it
instead of writing the figure again.

The figures hold on a loaded 2-core machine: each is many times what was measured idle.

This module sits at the bottom of the package beside ``deadline``, and imports nothing else.
"""

from __future__ import annotations

from .deadline import Deadline

# -- what a process needs: measured facts (see docs/design.md) -----------------------------------

STACKS_S = 1.0
"""How long processes asked for their stacks (SIGUSR1 to faulthandler) get to write them all:
a dump takes a few ms. The launcher's stacks rung; a pool's hang verdict."""

ASYNC_STALL_S = 0.5
"""How long an asynchronous (NCCL) group's completions must stand still, with an operation
pending, before it counts as waiting: a healthy NCCL group always has operations pending, and
torch's counts and the rank's sampler each lag up to about 0.2 s. The rank's sampler learns the
kind of the operation waited in then; the launcher starts reading /proc for the ranks then."""

REAP_S = 2.0
"""How long SIGKILLed processes get to be gone and reaped: kernel work only, a few ms idle.
The launcher's kill rung and its sweep of leftovers; ``proctree.kill_and_reap``."""

ANSWER_WINDOW_S = 0.5
"""How long a rank that saw a collective fail waits for its peers' answers to its probe
(``runtime.probe``): a live responder answers within ms; only a dead, stopped or GIL-holding
peer costs the whole window."""

SECOND_ASK_WINDOW_S = 2.0
"""The least ``regroup()`` waits for the peers that missed ``ANSWER_WINDOW_S``, asked once
more before it leaves them out; it waits ``SECOND_ASK_SHARE`` of what is left of its timeout
when that is longer, at most ``SECOND_ASK_CAP_S``. A live rank left out cannot come back, and
under load a live rank's answer may come seconds late (CI once saw two live ranks miss 2.5 s,
and the group formed without them), while a dead one costs only the rank that was not told
who failed: one that was (by its collective's error, or the launcher's notice) does not ask
it, and its membership is adopted."""

SECOND_ASK_SHARE = 0.5
"""The share of what is left of ``regroup()``'s timeout that its second ask may take (see
``SECOND_ASK_WINDOW_S``), at most ``SECOND_ASK_CAP_S``; the rest is the members' to join."""

SECOND_ASK_CAP_S = 5.0
"""The most ``regroup()``'s second ask waits: a dead peer that a rank keeping the size was not
told of costs it this much of a long timeout (``StepLoop``'s), and a live rank's answer that
misses 5.5 s in all is a rank stalled as long as a heartbeat timeout (torchft's 5 s) allows."""

IN_PLACE_COLLECTIVE_S = 1800.0
"""The collective deadline of ``rankguard run --recovery in-place`` when ``--collective-timeout``
is not given: torch's own default timeout, so that no collective fails sooner than it would
without rankguard. Its point is bounded mode, in which the launcher's notice releases the
survivors of a fault from their collective at once."""

COLD_START_S = 30.0
"""How long a new rank process may take to start Python, import torch and reach its
``init_process_group`` on a loaded 2-core machine (2.5 s idle, up to 10 s under load)."""


def second_ask_window(limit: Deadline) -> float:
    """Seconds ``regroup()`` waits for the answers of the peers it asks a second time:
    ``SECOND_ASK_SHARE`` of what is left of ``limit``, at least ``SECOND_ASK_WINDOW_S``, at most
    ``SECOND_ASK_CAP_S``, never past ``limit``."""
    share = SECOND_ASK_SHARE * limit.remaining()
    return limit.wait_time(min(SECOND_ASK_CAP_S, max(SECOND_ASK_WINDOW_S, share)))


def replace_timeout(hang_timeout: float) -> float:
    """How long, under ``--recovery in-place``, the survivors of a fault wait for a replacement
    to join, and the launcher for it to hold the state: a cold start, plus the hang timeout for
    a replacement that the hang rules would blame."""
    return COLD_START_S + hang_timeout


def replacement_limit(hang_timeout: float) -> float:
    """How long the launcher gives a replacement to join and hold the state: two of the
    survivors' joins (``runtime.vacancies.REPLACEMENT_WAITS``: a second rank may fail while they
    wait for the first one's replacement), plus ``COLD_START_S`` for the state's transfer and
    the replacement's first step."""
    return 2 * replace_timeout(hang_timeout) + COLD_START_S


REGROUP_S = 10.0
"""A pool's bound on forming a fresh generation after a failed call or test: the default of
``rankguard.regroup(timeout)`` (a store barrier, a probe of silent peers and a new gloo group:
about 10 ms idle)."""

CONNECT_FLOOR_S = 5.0
"""The least time ``regroup()`` gives the new generation's backend to connect its members
(gloo's full mesh), even when agreeing took its whole timeout: every member arrived, so it
takes milliseconds idle; a member that died in between fails the regroup after this, not
after the group's timeout (30 min for gloo), nor after gloo's five times this for a member
that never dials in (``runtime.backend_connect``)."""

CONNECT_CAP_S = 10.0
"""The most a new generation's backend is given to connect its members, however much of the
regroup's timeout is left: every member arrived, so only a member that died or froze since
needs more, and the others waited for it out the whole join's timeout (30 s under ``rankguard
run --recovery in-place``: a second rank killed just after a replacement joined cost that much
before the survivors could form the next generation)."""

EXIT_WAIT_CAP_S = 5.0
"""The most a rank's exit waits for the runtime's own calls still in flight (``exit_waits``): each
is waited for until its own deadline (a notice to the peers: 0.05 s plus 0.1 s of thread slack;
a probe's answer: a second), so only a call bounded by a long configured timeout meets the
cap."""

# -- the launcher (rankguard run) -----------------------------------------------------------------

TICK_S = 0.2
"""The launcher's attempt loop reads the ranks' ledgers and judges hangs at least this often
(events wake it sooner), so a hang is found within ``--hang-timeout`` plus a tick; a node's
agent beats no more often than this (``node_agent.beat_period``) and counts a gap of well over
a tick between its looks as having been stopped itself."""


def rank_grace(grace: float) -> float:
    """A rank's own SIGTERM teardown budget (``RANKGUARD_GRACE``) under the launcher's
    ``--grace``: 80% of it, so that the teardown ends, saying why, before the launcher's SIGKILL
    comes ``grace`` after the SIGTERM; never below 50 ms. The notice rung before the SIGTERM
    (ranks in bounded mode told that a peer failed) waits ``grace`` too: a rank told by a notice
    gets as long to end as one told by SIGTERM."""
    return max(grace * 0.8, 0.05)


NCCL_ABORT_S = 0.6
"""How long a SIGTERM teardown waits for NCCL's abort of the rank's communicators before it
exits without it (the exit releases them too): an idle communicator's abort took 0.5 s, one with
50 collectives queued behind a stuck one 1.3 to 2.9 s (one H100, over sockets). Bounded so that a
rank torn down inside a stuck collective exits within a second (issue 29). It also bounds a
regroup's abort of the old generation's idle communicators (their GPU buffers are freed)."""

NCCL_SYNC_S = 0.2
"""How long a SIGTERM teardown waits for the device's queued work once NCCL's abort returned:
what is left is the rank's own kernels; one that never ends (a stuck kernel) must not keep it."""

def linger_limit(straggler_timeout: float) -> float:
    """How long a rank's process may live on once its script ended with code 0 (its ledger
    says so) before the launcher takes its stacks and ends it: ``--straggler-timeout``, the
    bound of a rank that works without reaching a collective. A teardown may do real work (a
    non-daemon thread writing a checkpoint, an upload in an atexit handler) for as long as a
    busy straggler may; one blocked for good (a thread no one ends, a destructor waiting on the
    GPU) is bounded all the same, where torchrun waits forever."""
    return straggler_timeout


CASCADE_WINDOW_S = 0.3
"""A rank's error inside a collective is judged only this long after it happened: the fault of
a peer that caused it shows first (a dead peer's connection resets in ~20 ms; the launcher sees
its exit through a pidfd at once)."""

NODE_CASCADE_WINDOW_S = 2.0
"""With several nodes, a rank's error inside a collective is judged only this long after it
happened: a peer's fault on another node reaches this agent through the job's store (its own
agent sees it at once and publishes it within ms, under a second on a loaded machine), and the
first fault published ends the round on every node."""

FLUSH_S = 1.0
"""At the end of a run, how long the readers of the launcher's stdout and stderr get to take
what is still queued for them (``launcher.terminal``; the rank logs keep everything anyway)."""

DRAIN_S = 1.0
"""After an attempt, how long the ranks' output pipes get to reach their end (a process a rank
left behind may hold them open: then its output is read until this passes)."""

GUARDIAN_EXIT_S = 3.0
"""Told that the run ended cleanly, the guardian (``supervisor.guardian``) sweeps once and exits,
in tens of ms; the launcher waits this long for it before it kills it."""

# -- the pytest plugin -----------------------------------------------------------------------------

REPORT_MARGIN_S = 0.5
"""A ranks test stops waiting for its ranks' answers this long before its deadline (at most a
quarter of the time left), so that the report is made before the watchdog fires."""

EXPLAIN_MARGIN_S = REPORT_MARGIN_S + ANSWER_WINDOW_S + 1.0
"""The collectives of a ranks test give up this long before the test's deadline (at most half
the time left): room for the failing rank's probe (``ANSWER_WINDOW_S``), 1 s to send its answer
on a loaded machine, and ``REPORT_MARGIN_S``."""

REFORM_MARGIN_S = 1.0
"""Under a launcher, re-forming the process group after a failed test must end this long before
the test's deadline (at most a quarter of the time left), so the test fails with its own report."""

SESSION_END_NOTICE_S = 2.0
"""Under a launcher, a rank that reached its session's end takes up to this long (a few store
operations) to tell a peer that may re-form the group after a failure that it is in session
teardown, before its end-of-session barrier."""

RELEASE_GRACE_S = 2.0
"""When a test's deadline passed, its processes get this long between SIGTERM and SIGKILL."""

POOL_RANK_GRACE_S = rank_grace(RELEASE_GRACE_S)
"""The SIGTERM teardown budget of a pool's rank (``rankguard.Pool``, the plugin's warm ranks):
inside ``RELEASE_GRACE_S``, so that a rank released by the watchdog ends before its SIGKILL."""


def _margin(deadline: Deadline, seconds: float, share: float) -> float:
    """``seconds``, but at most ``share`` of the time left before ``deadline``."""
    return min(seconds, max(deadline.remaining(), 0.0) * share)


def answers_by(deadline: Deadline) -> Deadline:
    """When a ranks test under ``deadline`` stops waiting for its ranks' answers."""
    return deadline.before(_margin(deadline, REPORT_MARGIN_S, 0.25))


def collectives_by(deadline: Deadline) -> Deadline:
    """When the collectives of a ranks test under ``deadline`` give up."""
    return deadline.before(_margin(deadline, EXPLAIN_MARGIN_S, 0.5))


def reformed_by(deadline: Deadline) -> Deadline:
    """When re-forming the group after a failed test under ``deadline`` must have ended."""
    return deadline.before(_margin(deadline, REFORM_MARGIN_S, 0.25))
