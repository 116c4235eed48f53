"""A replacement rank's word that it has joined and holds the state: ``RANKGUARD_RECOVERY_FILE``.

Under ``rankguard run --recovery in-place`` the launcher gives each replacement process the path
of a file in its attempt's private folder. Once the replacement's ``rankguard.StepLoop`` has
received the state from a peer and rebuilt its wrappers, it writes there one JSON object:
``{"generation": G, "step": S, "source": R, "nbytes": B, "share_s": T, "held_at": W}`` (W: the
wall-clock time it wrote it), by a rename, so the launcher never reads half of it. The launcher
journals it (``replaced``) and then counts the replacement as done; until then it is pending,
within the replace timeout.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from . import private_files

PATH_ENV = "RANKGUARD_RECOVERY_FILE"
LIMIT = 4096  # bytes: the object is a few dozen


@dataclass(frozen=True)
class Joined:
    """What a replacement wrote once it held the state."""

    generation: int
    step: int
    source: int
    nbytes: int
    share_s: float
    held_at: float = 0.0  # wall-clock time the state was held (0.0: not written, an old writer)


def write(shared: Any, generation: int) -> None:
    """Write what ``shared`` (a ``peer_state.Shared``) says to ``$RANKGUARD_RECOVERY_FILE``, if
    the launcher set it; best effort (the launcher's timeout covers a file never written)."""
    target = os.environ.get(PATH_ENV)
    if not target:
        return
    record = {"generation": generation, "step": shared.step, "source": shared.source,
              "nbytes": shared.nbytes, "share_s": round(shared.took, 6),
              "held_at": round(time.time(), 6)}
    try:
        private_files.replace_with(target, json.dumps(record))
    except OSError:
        pass


def read(path: str) -> Joined | None:
    """The record at ``path``, or None while there is none (or it is not one)."""
    try:
        fields = json.loads(private_files.read_regular(path, LIMIT))
        return Joined(int(fields["generation"]), int(fields["step"]), int(fields["source"]),
                      int(fields["nbytes"]), float(fields["share_s"]),
                      float(fields.get("held_at", 0.0)))
    except (OSError, ValueError, TypeError, KeyError):
        return None
