"""The job store's key layout: every key and prefix the launcher and its node agents use,
spelled in one place.

Everything of a run lives under ``/rankguard/RUN_ID/``:

- ``attempt{N}/``: the ranks' keys in attempt N of a one-node run (each attempt its own prefix,
  so nothing an earlier attempt left behind is read as this one's);
- ``round{N}/``: the ranks' keys in round N of a multi-node run;
- ``round{N}.agents/``: the node agents' keys of round N (its end, the nodes done, beats);
- ``static{N}/``: the N-th static rendezvous (``--rdzv-backend static``) and, inside it,
  ``rankguard/node{R}``, the claims on node rank R;
- ``rounds``: the job-wide count of rounds formed;
- ``agents``: how many agents came to the job; ``left`` (and ``left.{K}``): how many left;
- ``job_end``: the job's end status, written once.
"""

from __future__ import annotations


def _run(run_id: str) -> str:
    return f"/rankguard/{run_id}/"


def attempt_namespace(run_id: str, attempt: int) -> str:
    """The ranks' store prefix in attempt ``attempt`` of a one-node run."""
    return f"{_run(run_id)}attempt{attempt}/"


def round_namespace(run_id: str, number: int) -> str:
    """The ranks' store prefix in round ``number`` of a multi-node run."""
    return f"{_run(run_id)}round{number}/"


def agents_namespace(run_id: str, number: int) -> str:
    """The agents' store prefix in round ``number`` (its end, the nodes done)."""
    return f"{_run(run_id)}round{number}.agents/"


def static_namespace(run_id: str, number: int) -> str:
    """The prefix of the ``number``-th static rendezvous of a run."""
    return f"{_run(run_id)}static{number}/"


def node_claim_key(node_rank: int) -> str:
    """Inside a static rendezvous's prefix: the count of agents that claimed ``node_rank``."""
    return f"rankguard/node{node_rank}"


def rounds_key(run_id: str) -> str:
    """The job-wide count of rounds formed (node 0 of each draws the round's number from it)."""
    return f"{_run(run_id)}rounds"


def agents_key(run_id: str) -> str:
    """How many agents came to the job (counted once each, as they first join)."""
    return f"{_run(run_id)}agents"


def left_key(run_id: str) -> str:
    """How many agents left the job (each also sets ``left.{its count}``)."""
    return f"{_run(run_id)}left"


def job_end_key(run_id: str) -> str:
    """The job's end status, written once by the agent that ends it."""
    return f"{_run(run_id)}job_end"
