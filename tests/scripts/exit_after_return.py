"""A script that returns (the ledger records exit code 0) whose process then exits 7 by
itself: ``exit_after_return.py MODE``, on rank 1 only (rank 0 ends at once).

- ``thread``: a non-daemon thread (an upload, say) fails after the script returned and calls
  ``os._exit(7)``;
- ``atexit``: an atexit handler calls ``os._exit(7)``.

Prints ``RETURNED rank=R`` as the script returns.
"""
import atexit
import os
import sys
import threading
import time

mode = sys.argv[1]
rank = int(os.environ["RANK"])


def fail_later() -> None:
    time.sleep(0.5)
    print("upload failed", flush=True)
    os._exit(7)


if rank == 1:
    if mode == "thread":
        threading.Thread(target=fail_later, name="uploader", daemon=False).start()
    elif mode == "atexit":
        atexit.register(os._exit, 7)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
print(f"RETURNED rank={rank}", flush=True)
