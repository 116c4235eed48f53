"""Rank 0 finishes; rank 1 fails while rank 0's process is still exiting:
``done_then_peer_fails.py FIFO``.

Rank 0 prints ``done`` and its script ends (exit code 0). Its interpreter is still exiting
(an atexit handler, like a slow flush) when it tells rank 1 through FIFO, a named pipe; rank 1,
which waited on that pipe, then exits with code 3. Rank 0's handler holds its exit until the
launcher's teardown SIGTERM comes (at most 60 s), then lets it exit 0: so its exit is seen
after the teardown began, though its work ended before the fault."""
import atexit
import os
import signal
import sys

fifo = sys.argv[1]


def exiting_slowly() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    with open(fifo, "w") as peer:
        peer.write("done\n")
    signal.sigtimedwait({signal.SIGTERM}, 60)


if os.environ["RANK"] == "0":
    atexit.register(exiting_slowly)
    print("done", flush=True)
else:
    with open(fifo) as peer:  # blocks until rank 0 opens it
        print(f"rank 0 said {peer.readline().strip()!r}", flush=True)
    sys.exit(3)
