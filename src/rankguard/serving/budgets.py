"""The time budgets and margins that steps of serving must agree on, in one place.

A call's budget is its :class:`~rankguard.deadline.Deadline`, made once by ``Pool.run`` from its
timeout and handed as is to the replica and, across the process boundary, to each rank. The
margins below are taken off that one instant where a step must end before it, so that the
error it raises still reaches the leader in time; the other budgets bound the steps that have
no deadline from the caller (start-up, regroup, shutdown, stacks, reaping). A figure that one
step alone uses (a zygote's fork, the first start-up estimate) stays in that step's module.
"""

from __future__ import annotations

# Figures serving shares with the rest of rankguard (see margins.py for each one's reason):
# STACKS_S: how long the ranks get to dump their stacks after a hang verdict (at least: the
#   pool gives them up to its call timeout);
# REAP_S: how long killed ranks get to be reaped;
# REGROUP_S: how long the ranks of a replica get to form a fresh generation after a fault they
#   survived (it runs in the background: a longer bound delays no call);
# POOL_RANK_GRACE_S: the SIGTERM teardown of a rank (RANKGUARD_GRACE) unless the caller's env
#   says, inside the pytest plugin's SIGTERM-to-SIGKILL release of a test's processes.
from ..margins import POOL_RANK_GRACE_S, REAP_S, REGROUP_S, STACKS_S

__all__ = ["POOL_RANK_GRACE_S", "REAP_S", "REGROUP_S", "STACKS_S"]  # and the names below

# A request's collectives (in the ranks) give up this long before the request's deadline, so
# that their errors reach the leader before it gives its verdict.
COLLECTIVE_MARGIN_S = 0.1
# How long a rank may take to accept a message before it counts as frozen.
SEND_S = 2.0
# How long a rank whose channel closed gets for its exit to be seen, before it counts as dead
# (not the zygote's report of an exit status: ``supervisor.zygote.STATUS_REPORT_S``).
EXIT_STATUS_S = 0.2
# The bound on the waits of a replica's store.
STORE_S = 30.0
# After REGROUP_S, how much longer the leader waits for the ranks' answers to a regroup.
REGROUP_MARGIN_S = 1.0
# At close, the ranks' bounded shutdown ends this long before the leader kills what is left;
# it gets at least SHUTDOWN_LEAST_S.
SHUTDOWN_MARGIN_S = 0.5
SHUTDOWN_LEAST_S = 0.1
# The first pause after a failed start-up; it doubles with each failure in a row, up to the
# pool's max_backoff.
BACKOFF_FIRST_S = 0.5
# Of the pool's timeout: the least time a call must have left to start on a replica.
MIN_CALL_FRACTION = 0.1
# A call whose deadline began before it (rankguard serve's, when the request's body was read) may
# come this much less than min_call_s before its deadline and still start, at most half of it:
# the hand-off from the server to the pool takes ms, and X-Request-Timeout may be min_call_s.
CALL_HANDOFF_S = 0.05
# Of the pool's timeout: how long a call may run before its replica is a suspect (drained, and a
# spare serves in its place). A healthy call that runs longer only lends the spare for a while.
SUSPECT_FRACTION = 0.2
# rankguard serve, on SIGTERM: the requests still running when --grace ends are answered 503
# then, from the event loop (ms); uvicorn's own cut, which would cancel them with a bare 500,
# comes this much later, so that it never has to.
HTTP_ANSWER_S = 1.0
# The pool's close after such a cut: the ranks still running a cut request are killed at once
# (they could join the shutdown barrier only once it ends); the other replicas get this long
# for their barrier (an idle replica's takes ms).
CUT_CLOSE_S = 1.0
