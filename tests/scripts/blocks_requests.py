"""A rank whose main thread blocks the stack requests' signals (SIGUSR1 and the real-time ones,
with ``signal.pthread_sigmask``, as a program that leaves signals to a thread of its own does),
says "ready" on stdout, then sleeps (``sleep``) or holds the GIL in one C call (``gil``)."""
import signal
import sys
import time

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1,
                                          *range(signal.SIGRTMIN, signal.SIGRTMAX + 1)})
print("ready", flush=True)
if sys.argv[1] == "gil":
    sum(range(10**15))
time.sleep(600)
