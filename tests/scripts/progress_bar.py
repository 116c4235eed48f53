"""Prints like a progress bar, never a newline: ``progress_bar.py MEGABYTES``.

Writes MEGABYTES MiB to stdout as 100-byte updates that each end with ``\\r``, then ``END``
with no line end at all."""
import sys

total = int(float(sys.argv[1]) * (1 << 20))
update = b"#" * 99 + b"\r"
out = sys.stdout.buffer
block = update * 640  # 64,000 bytes per write
for _ in range(total // len(block)):
    out.write(block)
out.write(b"END")
out.flush()
