"""How a rank's output pipe is split into lines for its log and the terminal (fast, no
processes): every byte reaches the log once, each line on the terminal gets the rank's prefix
once, and a line ends at \\n or \\r (progress bars); and torch's own prefixed lines, for real."""

import io
import re

import pytest

from rankguard.supervisor.output import MAX_PARTIAL, OutputStream
from tests.conftest import script


def _feed(chunks: list[bytes]) -> tuple[bytes, list[bytes]]:
    log, teed = io.BytesIO(), []
    stream = OutputStream(b"[r1]:", teed.append, log)
    for chunk in [*chunks, b""]:
        stream.feed(chunk)
    return log.getvalue(), teed


@pytest.mark.parametrize("chunks, log, tee", [
    ([b"a\nb\n"], b"a\nb\n", b"[r1]:a\n[r1]:b\n"),
    ([b"a\n\nb\n"], b"a\n\nb\n", b"[r1]:a\n[r1]:\n[r1]:b\n"),
    ([b"par", b"tial\n"], b"partial\n", b"[r1]:partial\n"),
    ([b"10%\r", b"20%\r", b"done\n"], b"10%\r20%\rdone\n", b"[r1]:10%\r[r1]:20%\r[r1]:done\n"),
    ([b"x\r", b"\ny\r\n"], b"x\r\ny\r\n", b"[r1]:x\r\n[r1]:y\r\n"),  # \r\n split across reads
    ([b"no line end"], b"no line end\n", b"[r1]:no line end\n"),
    # torch's C++ logging prefixes a rank's lines itself: not twice
    ([b"[r1]:[W] a\nb\n[r1]:[W] c\n"], b"[r1]:[W] a\nb\n[r1]:[W] c\n",
     b"[r1]:[W] a\n[r1]:b\n[r1]:[W] c\n"),
    ([b"[r2]:x\n"], b"[r2]:x\n", b"[r1]:[r2]:x\n"),  # another rank's prefix is text
])
def test_lines_reach_the_log_as_they_are_and_the_terminal_prefixed(chunks, log, tee):
    got_log, teed = _feed(chunks)
    assert got_log == log
    assert b"".join(teed) == tee


def test_a_line_without_end_is_written_once_it_is_long_instead_of_held_forever():
    got_log, teed = _feed([b"#" * (MAX_PARTIAL // 2)] * 3)
    assert got_log == b"#" * (3 * MAX_PARTIAL // 2) + b"\n"
    assert len(teed) == 2  # the first MAX_PARTIAL bytes, then the rest at the end of the pipe
    assert b"".join(teed) == b"[r1]:" + b"#" * (3 * MAX_PARTIAL // 2) + b"\n"


@pytest.mark.slow
def test_torchs_cpp_log_lines_of_a_real_rank_carry_its_prefix_once(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", script("cpp_log.py")], timeout=60)
    assert run.code == 0, run.stderr[-3000:]
    warnings = [line for line in run.stderr.splitlines() if "[c10d]" in line]
    assert warnings, run.stderr[-3000:]  # torch's C++ logging wrote, through the launcher
    assert all(re.match(r"\[rank[01]\]:\[W", line) for line in warnings), warnings
    assert "]:[rank" not in run.stdout + run.stderr, run.stderr[-3000:]
