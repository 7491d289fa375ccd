"""Mutual exclusion under chaos: real prefork workers killed, paused past their lease and cut
off from a restarted lock Redis, checked with fenced writes (see tests/support/chaos.py; a
longer soak: ``.venv/bin/python tests/chaos.py --seconds 300``)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from support.chaos import run_chaos

#: Seconds of chaos in the test suite.
CI_SECONDS = 55.0


@pytest.mark.timeout(240)
def test_no_two_accepted_runs_of_a_key_overlap_under_kills_pauses_and_restarts(
    tmp_path: Path,
) -> None:
    seed = random.randrange(1_000_000)
    lines: list[str] = []
    report = run_chaos(CI_SECONDS, seed=seed, log_dir=tmp_path, out=lines.append)
    print(f"seed {seed}:", *lines, sep="\n")
    summary = f"seed {seed}: " + "\n".join(lines)
    assert report.violations == [], summary
    # The chaos did happen, and the runs went through it.
    assert report.child_kills + report.worker_kills >= 1, summary
    assert report.pauses >= 1 and report.restarts >= 1, summary
    assert report.runs_sent >= 100 and report.lost_runs == 0, summary
    assert report.accepted_runs >= report.runs_sent * 0.9, summary
