"""Run a suite of test files through pytest in a subprocess, under a hard deadline, and read
the outcome of every test from its JUnit XML report."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from rankguard.processes import proctree


@dataclass
class Outcome:
    """One test case of the inner session."""

    name: str
    result: str  # passed | failed | error | skipped
    text: str  # failure or error message and details


@dataclass
class Session:
    code: int
    wall_s: float
    output: str
    cases: dict[str, list[Outcome]]

    def result(self, name: str) -> str:
        return ",".join(o.result for o in self.cases[name])

    def text(self, name: str) -> str:
        return "\n".join(o.text for o in self.cases[name])


def run_suite(folder: Path, files: dict[str, str], args: list[str], timeout: float,
              env: dict[str, str] | None = None) -> Session:
    """Write ``files`` into ``folder`` and run pytest on it (with ``env`` added to the
    environment); fail if it does not end in time."""
    for name, body in files.items():
        (folder / name).write_text(textwrap.dedent(body))
    report = folder / "report.xml"
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                             "-p", "no:timeout", f"--junitxml={report}", "-q", *args, str(folder)],
                            cwd=str(folder), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proctree.signal_tree(proc.pid, 9)
        output, _ = proc.communicate(timeout=10)
        pytest.fail(f"the inner pytest session did not end within {timeout} s:\n{output[-5000:]}")
    wall = time.monotonic() - started
    cases: dict[str, list[Outcome]] = {}
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            name = case.get("name", "")
            found = False
            for kind in ("failure", "error", "skipped"):
                for node in case.findall(kind):
                    text = (node.get("message") or "") + "\n" + (node.text or "")
                    cases.setdefault(name, []).append(Outcome(name, "failed" if kind == "failure"
                                                              else kind, text))
                    found = True
            if not found:
                cases.setdefault(name, []).append(Outcome(name, "passed", ""))
    return Session(proc.returncode, wall, output, cases)
