"""What the zygote tests' forked processes run (``main``): write a line to their log and one to
the descriptor named by ``ZYGOTE_TEST_FD``, then end as ``ZYGOTE_TEST_END`` says
(``exit:N``, ``signal:N``, or ``wait``: until the descriptor's other end closes)."""

from __future__ import annotations

import os
import sys


def main() -> None:
    end = os.environ["ZYGOTE_TEST_END"]
    fd = int(os.environ["ZYGOTE_TEST_FD"])
    print(f"child {os.getpid()} of {os.getppid()}, session {os.getsid(0)}, argv {sys.argv}",
          flush=True)
    os.write(fd, f"{os.getpid()}\n".encode())
    kind, _, value = end.partition(":")
    if kind == "exit":
        sys.exit(int(value))
    if kind == "signal":
        os.kill(os.getpid(), int(value))
    os.read(fd, 1)
