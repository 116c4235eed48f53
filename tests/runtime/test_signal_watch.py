"""The runtime's signal watcher (``runtime.signal_watch``) in a process of its own: a callback
that raises is said on stderr, and the watcher goes on answering the next signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

DEADLINE_S = 30

SCRIPT = textwrap.dedent("""
    import os, signal, threading
    from rankguard.runtime import signal_watch

    answered = threading.Event()

    def fails():
        raise OSError(28, "No space left on device")

    signal.signal(signal.SIGUSR1, lambda *_: None)
    signal.signal(signal.SIGUSR2, lambda *_: None)
    signal_watch.on(signal.SIGUSR1, fails)
    signal_watch.on(signal.SIGUSR2, answered.set)
    os.kill(os.getpid(), signal.SIGUSR1)
    os.kill(os.getpid(), signal.SIGUSR2)
    print("answered" if answered.wait(10) else "not answered", flush=True)
""")


def test_a_callback_that_raises_is_said_and_the_next_signal_is_still_answered() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "answered", (done.stdout, done.stderr)
    assert f"rankguard: answering signal {int(signal.SIGUSR1)} failed: " \
           "OSError(28, 'No space left on device')" in done.stderr, done.stderr
