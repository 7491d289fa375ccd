"""The worker benchmark's round-trip count: what an uncontended SingletonTask sends to its
lock Redis per run, counted inside a real worker (timings are reported, never asserted)."""

from __future__ import annotations

import argparse
import uuid

import pytest

from benchmarks import worker
from benchmarks.context import Context

COUNT = 12


# In the "process-heavy" xdist group with the chaos run (see tests/tasks/test_chaos.py).
@pytest.mark.xdist_group("process-heavy")
def test_an_uncontended_run_makes_at_most_two_lock_round_trips(lock_redis_url: str) -> None:
    ctx = Context(
        url=lock_redis_url,
        run_id=uuid.uuid4().hex[:12],
        options=argparse.Namespace(quick=True),
        embedded=True,
    )
    result = worker.run_worker(ctx, COUNT, 1, warmup=3)

    plain = result.samples["plain"].round_trips
    assert plain == [0] * COUNT  # the lock client is the tasks' only one: nothing else counted
    # until_start has no Python target, but frees its queue claim in the acquire's round trip.
    for key in (*worker.TARGETED, "until_start"):
        trips = result.samples[key].round_trips
        assert len(trips) == COUNT
        assert all(type(trip) is int for trip in trips), trips
        # The acquire and the release, and nothing more, whatever the options say.
        assert all(1 <= trip <= worker.TARGET_ROUND_TRIPS for trip in trips), (key, trips)
    # lock_on_enqueue claims at enqueue: one round trip per apply_async call.
    assert result.samples["lock_on_enqueue"].enqueue_round_trips == [1.0]
    assert result.samples["default"].enqueue_round_trips == [0.0]

    table, targets = worker.tables(result)
    column = list(table.headers).index("round trips/task")
    counted = {row[0]: row[column] for row in table.rows}
    assert counted[worker.LABELS["default"]].isdigit()  # a whole number of round trips
    trip_rows = [row for row in targets.rows if "round trips" in row[0]]
    assert [row[2] for row in trip_rows] == ["PASS"] * len(worker.TARGETED)
