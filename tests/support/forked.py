"""Run a function in a forked child of the test process and bring back what it returned.

The child never returns into pytest: it writes its report (JSON) to a pipe and ``_exit``s.
An exception in the child comes back as ``{"error": traceback}``; an optional alarm ends a
child that hangs instead of hanging the test.
"""

from __future__ import annotations

import json
import os
import signal
import traceback
from collections.abc import Callable
from typing import Any

import pytest

#: Marks a test that forks while threads of its own run (heartbeat, listener): Python 3.12+
#: warns that the child may deadlock, which is what such a test checks it does not.
FORKS_WITH_THREADS = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded, use of fork:DeprecationWarning"
)


def run_in_child(work: Callable[[], dict[str, Any]], *, alarm: int = 0) -> dict[str, Any]:
    """Fork; the child runs ``work`` and reports its dict. Asserts the child exited 0."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 0
        try:
            if alarm:
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                signal.alarm(alarm)
            os.close(read_end)
            try:
                payload = work()
            except BaseException:
                payload = {"error": traceback.format_exc()}
            os.write(write_end, json.dumps(payload).encode())
            os.close(write_end)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        chunks = []
        with os.fdopen(read_end, "rb") as reader:
            while chunk := reader.read():
                chunks.append(chunk)
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    report: dict[str, Any] = json.loads(b"".join(chunks))
    assert "error" not in report, report.get("error")
    return report
