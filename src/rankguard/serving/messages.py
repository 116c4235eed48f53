"""What the pool's leader and a rank of a replica say to each other over their channel
(``serving.channel``): dicts whose ``op`` is an :class:`Op`. ``serving.worker`` describes each
message's fields; ``serving.replica`` is the leader's side."""

from __future__ import annotations

import enum


class Op(enum.StrEnum):
    """A message's kind (its ``op``)."""

    # leader -> rank
    START = "start"  # form the group, run the setup
    RUN = "run"  # run a request
    REGROUP = "regroup"  # form a fresh generation after a failed request
    EXIT = "exit"  # a bounded shutdown, then exit
    # rank -> leader
    READY = "ready"  # the setup is done
    SETUP_FAILED = "setup_failed"  # the setup raised
    ANSWER = "answer"  # a request's result or error
    REGROUPED = "regrouped"  # whether the fresh generation formed
    BYE = "bye"  # the shutdown is done
