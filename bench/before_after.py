"""A bench script's figures with rankguard as it was at a commit and as it is now, in one run.

    python bench/before_after.py --before REV [--runs 3] -- bench/overhead_inprocess.py [ARGS]

Extracts ``src/`` of commit ``REV`` into a private temporary folder, then runs the given bench
script (from this tree, the same code both times) ``--runs`` times with each rankguard,
alternating (before, now, before, now, ...) so that a change in the machine's load falls on
both alike. Each output line's numbers are replaced by their medians over the runs and printed
as ``before -> now``; lines whose wording differs between the runs are printed as they are.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
RUN_S = 600  # a bench run that takes longer is stopped


def extract_src(rev: str, into: str) -> str:
    """``src/`` of commit ``rev`` of this repository, under ``into``; its path."""
    archive = os.path.join(into, "src.tar")
    with open(archive, "wb") as out:
        subprocess.run(["git", "archive", "--format=tar", rev, "src"], cwd=ROOT, stdout=out,
                       check=True, timeout=60)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return os.path.join(into, "src")


def run(script: list[str], src: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, *script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=RUN_S)
    if done.returncode:
        sys.exit(f"{' '.join(script)} failed with rankguard from {src}:\n{done.stderr[-2000:]}")
    return done.stdout.splitlines()


def medians(runs: list[list[str]]) -> list[tuple[str, list[float] | None]]:
    """Per line: its wording with the numbers taken out, and their medians over ``runs`` (None
    where the runs' lines do not share a wording)."""
    merged = []
    for lines in zip(*runs):
        shapes = {re.sub(r"\s+", " ", NUMBER.sub("{}", line)) for line in lines}
        if len(shapes) != 1:
            merged.append((lines[0], None))
            continue
        columns = zip(*[[float(n) for n in NUMBER.findall(line)] for line in lines])
        merged.append((shapes.pop(), [statistics.median(column) for column in columns]))
    return merged


def side_by_side(before: list[list[str]], now: list[list[str]]) -> list[str]:
    out = []
    for (shape, old), (shape_now, new) in zip(medians(before), medians(now)):
        if old is None or new is None or shape != shape_now:
            out.append(shape)
            continue
        pairs = iter(f"{a:g} -> {b:g}" for a, b in zip(old, new))
        out.append(re.sub(r"\{\}", lambda _: next(pairs), shape))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the commit to compare with (a rev)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each (default 3)")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS]")
    args = parser.parse_args()
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        parser.error("name the bench script after --, e.g. -- bench/overhead_inprocess.py")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    with tempfile.TemporaryDirectory(prefix="rankguard-before-") as folder:
        old_src = extract_src(args.before, folder)
        before, now = [], []
        for index in range(args.runs):
            print(f"run {index + 1} of {args.runs}...", file=sys.stderr)
            before.append(run(script, old_src))
            now.append(run(script, os.path.join(ROOT, "src")))
    print(f"{' '.join(script)}: medians of {args.runs} runs each, rankguard at {args.before} "
          "-> this tree")
    print("\n".join(side_by_side(before, now)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
