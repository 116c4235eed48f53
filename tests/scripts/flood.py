"""Prints as fast as it can: ``flood.py MEGABYTES``: lines of 1000 bytes (``R:N yyy...``, R
the rank, N the line's number), then ``DONE rank=R``. No process group."""
import os
import sys

rank = os.environ["RANK"]
out = sys.stdout.buffer
lines = int(float(sys.argv[1]) * 1000)
for start in range(0, lines, 64):
    out.write(b"".join(f"{rank}:{n} ".encode().ljust(999, b"y") + b"\n"
                       for n in range(start, min(start + 64, lines))))
out.write(f"DONE rank={rank}\n".encode())
out.flush()
