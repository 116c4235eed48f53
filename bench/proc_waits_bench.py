"""What judging one quiet rank costs the launcher per tick: a /proc sample of its process tree
(``proc_waits.sample``: threads' waits, the descriptors they wait on, the tree's CPU) beside
the sample it replaced (the process's CPU time, and its main thread's state and context
switches: two small files).

    python bench/proc_waits_bench.py [--repeat 200]

Each kind of wait runs in a real process started here (a Python process with a few helper
threads, as a rank has): a lock deadlock, a long sleep, ``subprocess.run`` of ``sleep``
capturing its output, and a blocking read of a socket to a server of this script. The first
sample of a socket reads the network namespace's socket tables (slow with many sockets: the
figure depends on the machine's socket count, printed); later ones reuse what the tracker
learnt. Medians, from one run.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import textwrap
import time

from rankguard.processes import proc_waits

HELPERS = "import threading, os\nfor _ in range(4): threading.Thread(target=os.read, args=(os.pipe()[0], 1), daemon=True).start()\n"
KINDS = {
    "lock deadlock": "import threading; l = threading.Lock(); l.acquire(); l.acquire()",
    "long sleep": "import time; time.sleep(600)",
    "subprocess.run, output captured": "import subprocess; subprocess.run(['sleep', '600'], capture_output=True)",
    "read of a socket": "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1]))).recv(1)",
}


def _old_sample(pid: int) -> tuple:
    """What progress.py read before: /proc/PID/stat and the main thread's status."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        status = f.read()
    return stat, status


def _median_ms(call, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    with open("/proc/net/tcp") as f4, open("/proc/net/tcp6") as f6:
        sockets = len(f4.readlines()) + len(f6.readlines()) - 2
    print(f"{sockets} TCP sockets in this network namespace; medians of {args.repeat} samples")
    print(f"{'the rank waits in':34} {'old sample':>11} {'first':>9} {'later':>9}  seen as")
    for name, code in KINDS.items():
        proc = subprocess.Popen([sys.executable, "-c", HELPERS + textwrap.dedent(code), str(port)])
        try:
            conn = server.accept()[0] if "socket" in name else None
            time.sleep(1.0)  # it reaches its wait
            old = _median_ms(lambda: _old_sample(proc.pid), args.repeat)
            start = time.perf_counter()
            known: dict = {}
            first = proc_waits.sample(proc.pid, proc_waits.JobPeers(), known)
            first_ms = (time.perf_counter() - start) * 1e3
            later = _median_ms(lambda: proc_waits.sample(proc.pid, proc_waits.JobPeers(), known),
                               args.repeat)
            what = first.main.what if first else "gone"
            print(f"{name:34} {old:8.3f} ms {first_ms:6.2f} ms {later:6.3f} ms  {what}")
            if conn is not None:
                conn.close()
        finally:
            children = proc_waits.tree(proc.pid)[1:]
            proc.kill()
            proc.wait()
            for child in children:
                os.kill(child, 9)
    server.close()


if __name__ == "__main__":
    main()
