"""How a rank's log says that a peer's failure released it, in each of the ways a race allows:
inside its collective (``PeerFailed``), as it started one (``GroupRetired``: the peer's notice
came first), or, when the peer was already in a later test before this rank started this one,
by skipping this test (the plugin's skip reason names the failure)."""

from __future__ import annotations

import re

_RELEASED = (r"(PeerFailed: rank \d+: \w+ #\d+ on group 'world' was abandoned: "
             r"|GroupRetired: process group 'world' is retired \("
             r"|the other ranks were past this test when the process group was re-formed after )")


def released_by(text: str, why: str) -> bool:
    """Whether ``text`` (a rank's output) says it was released by the failure ``why`` (a
    regular expression: ``rank 1 failed test_suite\\.py::test_x``)."""
    return re.search(_RELEASED + why, text) is not None
