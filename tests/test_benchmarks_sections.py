"""Every benchmark section, every row, for a handful of iterations: ``python -m benchmarks``
must keep running (its comparison locks included) whatever the package's internals become.
Timings are printed, never asserted."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from support.waiting import TESTS

from benchmarks import tasks, worker
from benchmarks.anchors import ANCHORS, DIAGNOSTICS
from benchmarks.registry import discover

#: The smallest counts each section accepts: a smoke run, not a measurement.
TINY = [
    "--quick",
    *("--rounds", "1", "--pairs", "5", "--handoffs", "2", "--leases", "10", "--ticks", "1"),
    *("--rw-rounds", "1", "--rw-pairs", "5", "--rw-handoffs", "2", "--rw-server-rounds", "1"),
    *("--task-count", "5", "--task-rounds", "1", "--worker-count", "5", "--worker-rounds", "1"),
    *("--redis-time-rounds", "1", "--redis-time-pairs", "5"),
]
#: The rows of the reader-writer section's throughput table.
RW_ROWS = ["lease", "read", "write", "range read"]


# In the "process-heavy" xdist group with the chaos run (see tests/test_chaos.py).
@pytest.mark.xdist_group("process-heavy")
@pytest.mark.timeout(300)
def test_every_section_runs_every_row(lock_redis_url: str) -> None:
    env = {**os.environ, "REDIS_URL": lock_redis_url}
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks", *TINY],
        cwd=TESTS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "Traceback" not in output, output
    for section in discover():
        assert re.search(rf"^\({section.name}: \d+ s\)$", run.stdout, re.M), section.name
    labels = [a.label for a in (*ANCHORS.values(), *DIAGNOSTICS.values())]
    labels += [*tasks.LABELS.values(), *worker.LABELS.values(), *RW_ROWS]
    for label in labels:
        # A row is the label, then its figures.
        row = re.compile(rf"^{re.escape(label)}  +.*\d", re.M)
        assert row.search(run.stdout), f"no row for {label!r}:\n{run.stdout}"
