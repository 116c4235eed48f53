"""A rank's output pipes, line by line, into its log file and (optionally) a terminal.

Each of a rank's stdout and stderr goes, as it comes, to its log file and to a tee (the
launcher's terminal), each line prefixed with ``[rankN]:`` unless it begins with it already
(torch's C++ logging prefixes its own lines so once ``init_process_group`` set the rank). A
line ends at ``\\n`` or ``\\r`` (progress bars), so a rank that never prints a newline is
still shown; a partial line is held back (up to ``MAX_PARTIAL`` bytes) so that ranks' lines do
not interleave. Each byte is handled a bounded number of times: the cost is linear in the
output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import IO, Callable

MAX_PARTIAL = 1 << 16  # bytes of an unfinished line held back before it is written anyway
_LINE_END = rb"(\r\n|\r(?!\n)|\n)"


@dataclass
class OutputStream:
    """One output pipe of a rank: where it goes and its unfinished line."""

    prefix: bytes
    tee: Callable[[bytes], None] | None
    log: IO[bytes]
    partial: bytearray = field(default_factory=bytearray)
    at_line_start: bool = True  # the last byte written ended a line
    _line_start: re.Pattern[bytes] = field(init=False, repr=False)  # a line ends, one begins

    def __post_init__(self) -> None:
        self._line_start = re.compile(_LINE_END + rb"(?=.)(?!" + re.escape(self.prefix) + rb")",
                                      re.DOTALL)

    def feed(self, data: bytes) -> None:
        """Take the next bytes read from the pipe (``b""``: end of file)."""
        if not data:
            if self.partial or not self.at_line_start:  # end the last line
                self._emit(bytes(self.partial) + b"\n")
                self.partial.clear()
            return
        cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if cut == len(data) - 1 and data[cut] == 13:  # a lone \r could be half of \r\n
            cut = max(data.rfind(b"\n", 0, cut), data.rfind(b"\r", 0, cut))
        if cut < 0:
            self.partial += data
            if len(self.partial) < MAX_PARTIAL:
                return
            block = bytes(self.partial)
            self.partial.clear()
        else:
            block = bytes(self.partial) + data[:cut + 1]
            self.partial[:] = data[cut + 1:]
        self._emit(block)

    def _emit(self, block: bytes) -> None:
        self.log.write(block)
        self.log.flush()
        if self.tee is not None:
            lines = self._line_start.sub(rb"\1" + self.prefix, block)
            first = self.at_line_start and not block.startswith(self.prefix)
            self.tee(self.prefix + lines if first else lines)
        self.at_line_start = block.endswith((b"\n", b"\r"))
