"""The end of a session whose main thread cannot be interrupted (stuck inside C code).

``LAST_RESORT_S`` after it interrupted the main thread in vain, the watchdog ends the process
(``os._exit``) so that CI never waits for its own timeout. Before that, from the watchdog's
thread, :func:`report_and_finish` does what pytest would have done had the test failed, so that
the report is not lost with the process:

1. stop capturing: the process's fd 1 and 2 go back to the terminal, and what the test wrote so
   far is attached to its report;
2. report the test's phase as failed, with the deadline's report (``pytest_runtest_logreport``:
   the terminal's progress and summary, the junit XML, an xdist controller);
3. finish the session (``pytest_sessionfinish``: the terminal's summary, saying why the session
   ends; the junit XML file is written).

The hooks run while the main thread is stuck wherever it is. A plugin that waits for it would
block them: the watchdog bounds this step and writes the bare report to the terminal instead.
"""

from __future__ import annotations

import sys
import time

import pytest


def report_and_finish(item: pytest.Item, when: str, report: str, duration: float,
                      why: str) -> None:
    """Report ``item``'s phase ``when`` as failed with ``report`` and finish the session,
    whose last line says ``why`` it ends. May block in another plugin's hook: bound it."""
    config = item.config
    sections = []
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)
        out, err = capture.read_global_capture()
        sections = [(f"Captured {name} {when}", text) for name, text in
                    (("stdout", out), ("stderr", err)) if text]
    now = time.time()
    config.hook.pytest_runtest_logreport(report=pytest.TestReport(
        item.nodeid, item.location, {name: 1 for name in item.keywords}, "failed", report,
        when, sections, duration, now - duration, now))  # type: ignore[arg-type]
    config.hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    session = item.session
    session.shouldstop = why
    session.exitstatus = pytest.ExitCode.INTERRUPTED
    # the terminal prints its summary for "tests failed" (for "interrupted" it expects the
    # KeyboardInterrupt it did not see); the process ends with "interrupted" all the same
    config.hook.pytest_sessionfinish(session=session, exitstatus=pytest.ExitCode.TESTS_FAILED)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
