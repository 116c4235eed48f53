"""A pool whose leader runs out of file descriptors while it heals (run by test_zygote): the
start-ups that fail for it are retried with backoff, and the pool heals once descriptors are
free again. Prints what happened; exits 0 when the pool healed."""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import rankguard  # noqa: E402
from rankguard.records import journal  # noqa: E402
from tests.serving import rank_functions as rf  # noqa: E402


def main() -> int:
    folder = os.environ.get("TMPDIR", "/tmp")
    log = os.path.join(folder, f"fd-starved-{os.getpid()}.jsonl")
    with rankguard.Pool(2, rf.load, spares=0, timeout=2.0, max_backoff=1.0, journal=log) as pool:
        pool.run(rf.pid)
        hogs = []
        try:
            while True:  # every free descriptor taken
                hogs.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        for _ in range(3):  # a start may win a descriptor the retired replica freed: again
            try:
                pool.run(rf.forward, 1.0, fault=(1, "kill"))
            except (rankguard.RequestFailed, rankguard.PoolUnavailable) as error:
                print("fault:", type(error).__name__, error)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not pool.metrics().get("start_failures") \
                    and not pool.status().idle:
                try:  # descriptors the killed rank's end released are taken too
                    while True:
                        hogs.append(os.open(os.devnull, os.O_RDONLY))
                except OSError:
                    pass
                time.sleep(0.05)  # (reading the journal would need a descriptor)
            if pool.metrics().get("start_failures"):
                break
        for fd in hogs:
            os.close(fd)
        print("metrics:", pool.metrics())
        for event in journal.read(log):
            if event["event"] in ("group_start_failed", "zygote_failed", "group_start"):
                print(event["event"], event.get("detail", ""))
        started = time.monotonic()
        try:
            result = pool.run(rf.forward, 1.0, timeout=60)
        finally:
            print(f"waited {time.monotonic() - started:.1f} s:", pool.status())
        print("healed" if result == rf.expected(1.0, 2) else f"wrong result {result}")
    os.unlink(log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
