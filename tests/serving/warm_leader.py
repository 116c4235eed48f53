"""A leader of one warm rank, for the warm ranks' tests: ``python -m tests.serving.warm_leader
FOLDER`` starts a warm rank on the CPU, prints its pid once it is ready (or ``late`` after 60 s),
then sleeps until it is killed."""

from __future__ import annotations

import sys
import threading
import time

from rankguard.deadline import Deadline
from rankguard.serving.warm_spares import WarmSpares


def main() -> None:
    changed = threading.Event()
    warm = WarmSpares({}, sys.argv[1], 60.0, changed.set)
    warm.fill("cpu", 1)
    limit = Deadline.after(60.0)
    start = warm.take("cpu")
    while start is None and not limit.passed():
        changed.wait(limit.wait_time(cap=1.0))
        changed.clear()
        start = warm.take("cpu")
    print(start.pid if start is not None else "late", flush=True)
    time.sleep(120)


if __name__ == "__main__":
    main()
