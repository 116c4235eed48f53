"""A script that returns (exit code 0) but whose process does not exit: ``linger.py MODE
RANK``, rank RANK lingers, the others end at once.

- ``thread``: a non-daemon thread blocked for good (Python joins it before it exits);
- ``atexit``: an atexit handler that sleeps for good.

Prints ``RETURNED rank=R`` as the script returns.
"""
import atexit
import os
import sys
import threading
import time

mode, lingerer = sys.argv[1], int(sys.argv[2])
rank = int(os.environ["RANK"])
FOREVER = 100000


def hold_forever() -> None:
    threading.Event().wait()


def sleep_at_exit() -> None:
    time.sleep(FOREVER)


if rank == lingerer:
    if mode == "thread":
        threading.Thread(target=hold_forever, name="holder", daemon=False).start()
    elif mode == "atexit":
        atexit.register(sleep_at_exit)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
print(f"RETURNED rank={rank}", flush=True)
