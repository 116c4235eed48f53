"""Time budgets of the launcher's end-to-end tests, derived from the timeouts each run is given
and the launcher's own step budgets, so that they hold on a loaded 2-core CI machine.

Each budget is what the launcher promises (``--hang-timeout``, ``--grace``, its tick, its
stacks step, the guardian's sweep) plus one named margin, ``LOAD_SLACK_S``: how much later than
promised a loaded machine may let a process wake up and act. The budgets bound what the tests
assert; they prove boundedness, not speed (bench/ measures speed).
"""

from __future__ import annotations

from rankguard.supervisor.guardian import SWEEP_S
from rankguard.margins import STACKS_S, TICK_S

# How much later than promised a loaded 2-core machine (two busy test processes beside the run)
# may let the launcher, a rank or the guardian wake up and act: up to 1.6 s beside a 4-rank DDP
# test under `-n 2`; about twice that, as the bound only proves boundedness.
LOAD_SLACK_S = 3.0


# The --grace a test gives when it asserts that every rank tore down on its own (outcome
# "victim"): a rank with nothing to release needs milliseconds, but on a loaded machine its
# teardown thread may first wait LOAD_SLACK_S to run (CI once saw a sleeping rank miss 2 s).
CLEAN_TEARDOWN_GRACE_S = 1.0 + LOAD_SLACK_S


def hang_waited_s(hang_timeout: float) -> float:
    """The most a hang verdict's ``waited_s`` may be: the waiters waited ``hang_timeout``; the
    frozen rank's last progress was sampled at most one tick after it froze, and the check
    that saw both comes at most one tick later."""
    return hang_timeout + 2 * TICK_S + LOAD_SLACK_S


def stopped_within_s(grace: float) -> float:
    """The most the launcher may take from a fault (a rank's death, a signal to itself) to every
    rank stopped when each rank ends on SIGTERM: the stacks step, then the ranks' teardown
    within ``grace``."""
    return STACKS_S + grace + LOAD_SLACK_S


def guardian_sweep_s() -> float:
    """The most the guardian may take, once the launcher died, to kill the job's processes."""
    return SWEEP_S + LOAD_SLACK_S
