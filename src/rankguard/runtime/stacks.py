"""Stacks on demand: a rank writes the Python stacks of all its threads when asked.

The request is ``SIGUSR1``, best sent to the rank's main thread (``proctree.signal_main_thread``):
``faulthandler`` answers it from a C-level signal handler, so the dump is written even while the
main thread is inside a C call (a gloo collective, a CUDA synchronize) or holds the GIL in a busy
loop, and no Python code of the rank has to run. Each dump is appended to the rank's stacks file.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import tempfile
from typing import IO

STACK_SIGNAL = signal.SIGUSR1
_file: IO[str] | None = None


PATH_ENV = "RANKGUARD_STACKS"


def path_for(pid: int, environ: dict[str, str]) -> str:
    """Where the runtime of process ``pid``, whose environment is ``environ``, writes its
    stacks: ``$RANKGUARD_STACKS`` (set by the launcher, the pytest plugin and pools), else
    ``<tmp>/rankguard-stacks-<pid>.txt``."""
    return environ.get(PATH_ENV) or os.path.join(tempfile.gettempdir(),
                                                 f"rankguard-stacks-{pid}.txt")


def install(path: str | None = None) -> str:
    """Answer ``SIGUSR1`` with a dump of every thread's stack, appended to ``path``.

    ``path`` defaults to ``$RANKGUARD_STACKS`` (set by the launcher or the pytest plugin), else
    ``<tmp>/rankguard-stacks-<pid>.txt``. Calling it again moves the dumps to the new path.
    Returns the path.
    """
    global _file
    path = path or path_for(os.getpid(), dict(os.environ))
    if _file is not None and _file.name == path:
        return path
    new = open(path, "a")  # noqa: SIM115 (kept open for the process's life)
    faulthandler.register(STACK_SIGNAL, file=new, all_threads=True, chain=False)
    if _file is not None:
        _file.close()
    _file = new
    return path


def installed_path() -> str | None:
    """Where this process writes its stacks, or None if it does not answer requests."""
    return _file.name if _file is not None else None
