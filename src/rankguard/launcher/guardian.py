"""The guardian: a small process that outlives a killed launcher and ends the job's processes.

``python -m rankguard.launcher.guardian TOKEN [FOLDER...]``, started by the launcher in a
session of its own with a pipe on its stdin. When the pipe closes (the launcher exited, however
it died), it kills every process of the run (its marker, its cgroup: see
``proctree.with_marker``), sweeping a few times over ``SWEEP_S`` seconds to catch processes that
were starting, then removes the run's FOLDERs (its private ledger folder in /dev/shm). A
launcher that finished its own teardown writes ``CLEAN_EXIT`` first: then one sweep is enough.
Without it, SIGKILL to a launcher leaves orphaned ranks (measured with torchrun). Ranks also ask
for SIGKILL on the launcher's death (PR_SET_PDEATHSIG); the guardian catches what that misses:
their children, and anything that left their tree.

While the job runs it costs nothing: it is blocked reading the pipe.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

from ..deadline import Deadline
from ..processes.proctree import forget, kill_all, with_marker

SWEEP_S = 1.0
SWEEP_EVERY_S = 0.1
CLEAN_EXIT = b"done"


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    token, folders = sys.argv[1], sys.argv[2:]
    received = b""
    while chunk := os.read(0, 4096):
        received += chunk
    end = Deadline.after(0.0 if received.endswith(CLEAN_EXIT) else SWEEP_S)
    while True:
        kill_all(with_marker(token))
        if end.passed():
            forget(token)  # the run's cgroup, empty now (a launcher that ended removed it)
            break
        time.sleep(SWEEP_EVERY_S)  # not a wait for anything: the pace of the sweeps
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
