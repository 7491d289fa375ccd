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

from benchmarks import memory, tasks, worker
from benchmarks.anchors import ANCHORS, DIAGNOSTICS
from benchmarks.registry import discover

#: The smallest counts each section accepts: a smoke run, not a measurement.
TINY = [
    "--quick",
    *("--rounds", "1", "--pairs", "5", "--handoffs", "2", "--leases", "10", "--ticks", "1"),
    *("--rw-rounds", "1", "--rw-pairs", "5", "--rw-handoffs", "2", "--rw-server-rounds", "1"),
    *("--task-count", "5", "--task-rounds", "1", "--worker-count", "5", "--worker-rounds", "1"),
    *("--redis-time-rounds", "1", "--redis-time-pairs", "5"),
    *("--memory-uses", "3"),
]
#: The rows of the reader-writer section's throughput table.
RW_ROWS = ["lease", "read", "write", "range read"]


# In the "process-heavy" xdist group with the chaos run (see tests/tasks/test_chaos.py).
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
    labels += [*tasks.LABELS.values(), *worker.LABELS.values(), *memory.LABELS.values(), *RW_ROWS]
    for label in labels:
        # A row is the label, then its figures.
        row = re.compile(rf"^{re.escape(label)}  +.*\d", re.M)
        assert row.search(run.stdout), f"no row for {label!r}:\n{run.stdout}"


#: A row of the memory section's figures: the label, keys left, kinds, bytes, seconds left,
#: MB·s per use and the two steady states, two or more spaces apart (text output).
MEMORY_ROW = (
    r"  +(\d+)  +.+?  +[\d,]+  +(?:[\d.,]+ s|–)  +[\d.e-]+" + r"  +(?:[\d.,e-]+ MB|0)" * 2 + "$"
)


@pytest.mark.timeout(120)
def test_memory_section_has_a_row_for_ours_and_every_anchor() -> None:
    # No REDIS_URL: the section's own throwaway redis-server, with the default key prefix
    # (the all-sections run above covers a shared server).
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks", "memory", "--quick", "--memory-uses", "3"],
        cwd=TESTS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "Traceback" not in output, output
    assert re.search(r"^\(memory: \d+ s\)$", run.stdout, re.M), output
    for title in ("What one finished use leaves in Redis", "result backend's key", "Targets"):
        assert title in run.stdout, output
    left = {}
    for key, label in memory.LABELS.items():
        found = re.search(rf"^{re.escape(label)}{MEMORY_ROW}", run.stdout, re.M)
        assert found, f"no row for {label!r}:\n{run.stdout}"
        left[key] = int(found[1])
    # Ours leaves keys today (issue 35); the anchors' releases delete theirs.
    assert left["lease"] >= 1 and left["task"] >= 1, left
    assert left["redis-py"] == left["celery-singleton"] == left["celery-once"] == 0, left
    assert "NO EXPIRY" not in run.stdout, output
