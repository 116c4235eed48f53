"""The environment a pool's leader gives its rank processes (``serving.worker``), apart from
torch's env:// variables: where the rank's channel is, and what lets the rank import what the
leader's pickles refer to. Its own module so that the leader does not import the worker's."""

from __future__ import annotations

import json
import os
import sys

FD = "RANKGUARD_SERVE_FD"
SYS_PATH = "RANKGUARD_SERVE_SYS_PATH"
MAIN = "RANKGUARD_SERVE_MAIN"
LEADER = "RANKGUARD_SERVE_LEADER"


def leader_context() -> dict[str, str]:
    """Environment that lets a rank import what the leader's pickles refer to: the leader's
    ``sys.path``, and its main module (functions defined in a script are ``__main__.f``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and not spec.name.endswith("__main__"):
        reference = "name:" + spec.name
    elif spec is None and getattr(main, "__file__", None):
        reference = "path:" + os.path.abspath(main.__file__)
    else:
        reference = ""
    paths = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    return {SYS_PATH: json.dumps(paths), MAIN: reference, LEADER: str(os.getpid())}
