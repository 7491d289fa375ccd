"""Randomised operation sequences on range and reader-writer locks against an in-memory
model; plus the heartbeat renewing every kind of lock in one round trip."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, multiple, rule

from celery_singleton_lock import LockClient
from celery_singleton_lock.core import renewal
from celery_singleton_lock.core.heartbeat import Heartbeat

COMPATIBLE = {("r", "r"), ("r", "u"), ("u", "r")}
points = st.integers(0, 12).map(float)
modes = st.sampled_from("ruw")


class Hold:
    def __init__(self, handle: Any, mode: str, lo: float, hi: float, parent: Hold | None) -> None:
        self.handle, self.mode, self.lo, self.hi, self.parent = handle, mode, lo, hi, parent


def inside(hold: Hold, a: float, b: float) -> tuple[float, float]:
    """A sub-interval of ``hold`` near [a, b]: clamped into it, never empty."""
    lo = min(max(min(a, b), hold.lo), hold.hi)
    return lo, min(max(max(a, b), lo), hold.hi)


class LockMachine(RuleBasedStateMachine):
    """Every grant and refusal must match the model: a request conflicts with a live hold
    that overlaps it (closed intervals) in an incompatible mode, unless it nests in it."""

    url = ""
    holds = Bundle("holds")

    def __init__(self) -> None:
        super().__init__()
        self.client = LockClient.from_url(self.url, prefix=f"csltest:{uuid.uuid4().hex[:12]}:")
        self.ranges = self.client.range_lock("r")
        self.rw = self.client.rwlock("rw")
        self.live: list[Hold] = []

    def teardown(self) -> None:
        self.client.close()

    def conflicts(self, mode: str, lo: float, hi: float, parent: Hold | None, rw: bool) -> bool:
        for hold in self.live:
            if (hold.lo == -1e9) is not rw or hold is parent:
                continue
            if hold.lo <= hi and lo <= hold.hi and (hold.mode, mode) not in COMPATIBLE:
                return True
        return False

    def _take(self, handle: Any, mode: str, lo: float, hi: float, parent: Hold | None) -> Any:
        rw = lo == -1e9
        expected = not self.conflicts(mode, lo, hi, parent, rw)
        assert handle.acquire(wait=0) is expected, (mode, lo, hi, [vars(h) for h in self.live])
        if not expected:
            return multiple()  # refused: nothing for later rules to use
        hold = Hold(handle, mode, lo, hi, parent)
        self.live.append(hold)
        return hold

    @rule(target=holds, mode=modes, a=points, b=points)
    def take_range(self, mode: str, a: float, b: float) -> Any:
        lo, hi = min(a, b), max(a, b)
        make = {"r": self.ranges.read, "u": self.ranges.upgradable, "w": self.ranges.write}
        return self._take(make[mode](lo, hi, heartbeat=False), mode, lo, hi, None)

    @rule(target=holds, mode=modes)
    def take_rw(self, mode: str) -> Any:
        make = {"r": self.rw.read, "u": self.rw.upgradable, "w": self.rw.write}
        return self._take(make[mode](heartbeat=False), mode, -1e9, 1e9, None)

    @rule(target=holds, hold=holds, a=points, b=points)
    def nest_write(self, hold: Hold, a: float, b: float) -> Any:
        if hold not in self.live or hold.mode != "u" or hold.lo == -1e9:
            return multiple()
        lo, hi = inside(hold, a, b)
        return self._take(hold.handle.write(lo, hi, heartbeat=False), "w", lo, hi, hold)

    @rule(hold=consumes(holds))
    def release(self, hold: Hold) -> None:
        if hold not in self.live:
            return
        hold.handle.release()
        self.live.remove(hold)

    @rule(hold=holds, a=points, b=points)
    def shrink(self, hold: Hold, a: float, b: float) -> None:
        if hold not in self.live or hold.lo == -1e9:
            return
        lo, hi = inside(hold, a, b)
        hold.handle.shrink(lo, hi)
        hold.lo, hold.hi = lo, hi

    @rule(hold=holds)
    def upgrade_or_downgrade(self, hold: Hold) -> None:
        if hold not in self.live or hold.lo != -1e9 or hold.mode == "r":
            return
        if hold.mode == "w" and hold.handle.mode == "u":
            hold.handle.downgrade()
            hold.mode = "u"
        elif hold.mode == "u":
            others = [h for h in self.live if h.lo == -1e9 and h is not hold]
            expected = not others
            assert hold.handle.upgrade(wait=0) is expected
            if expected:
                hold.mode = "w"


@pytest.mark.timeout(120)
def test_locks_match_the_model(lock_redis_url: str) -> None:
    LockMachine.url = lock_redis_url
    run = LockMachine.TestCase
    run.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
    run().runTest()


@contextmanager
def pipeline_executes(redis: Any) -> Iterator[list[int]]:
    """The commands each pipeline of ``redis`` sent, one entry per round trip (execute)."""
    executes: list[int] = []
    real_pipeline = redis.pipeline

    def counting_pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = real_pipeline(*args, **kwargs)
        real_execute = pipe.execute

        def execute(*a: Any, **k: Any) -> Any:
            executes.append(len(pipe.command_stack))
            return real_execute(*a, **k)

        pipe.execute = execute
        return pipe

    redis.pipeline = counting_pipeline
    try:
        yield executes
    finally:
        redis.pipeline = real_pipeline


def renewing(handles: list[Any]) -> Heartbeat:
    """A heartbeat of the test's own renewing ``handles`` (held with ``heartbeat=False``):
    nothing else of the process is in its ticks, and its thread waits a third of their ttl
    (10 s) before its first tick of its own."""
    beat = Heartbeat()
    for handle in handles:
        beat.add(handle)
    return beat


def test_heartbeat_renews_every_kind_in_one_round_trip(lock_client: LockClient) -> None:
    handles = [
        lock_client.lease("a", ttl=30, heartbeat=False),
        lock_client.rwlock("b").read(ttl=30, heartbeat=False),
        lock_client.range_lock("c").read(0, 1, ttl=30, heartbeat=False),
        lock_client.multi(["d", "e"], ttl=30, heartbeat=False),
    ]
    assert all(h.acquire() for h in handles)
    beat = renewing(handles)
    beat.tick()  # loads the renew scripts into a fresh server
    redis = lock_client.redis
    # The holds' keys; not the fencing counters, which no renewal touches.
    holds = [k for k in redis.keys(lock_client.prefix + "{*") if not k.endswith(b":fence")]
    for key in holds:
        redis.pexpire(key, 5000)  # as if the last renewal was long ago
    stats_before = redis.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    with pipeline_executes(redis) as executes:
        beat.tick()
    beat.stop()
    stats_after = redis.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert executes == [4]  # one pipeline round trip, one script call per kind
    assert stats_after - stats_before >= 4
    for key in holds:
        assert redis.pttl(key) > 20_000, key  # every hold renewed to its 30 s
    for handle in handles:
        handle.check()
        handle.release()


def test_a_tick_renewing_more_than_one_call_carries_splits_them_in_one_round_trip(
    lock_client: LockClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script blocks Redis while it runs: a tick renewing many holds sends them in calls of
    at most RENEWALS_PER_CALL each (here 2), still in one pipeline, and renews them all."""
    monkeypatch.setattr(renewal, "RENEWALS_PER_CALL", 2)
    leases = [lock_client.lease(f"split-{i}", ttl=30, heartbeat=False) for i in range(5)]
    assert all(lease.acquire() for lease in leases)
    beat = renewing(leases)
    beat.tick()  # loads the renew script into a fresh server
    redis = lock_client.redis
    for lease in leases:
        redis.pexpire(lease.keys.lock, 5000)  # as if the last renewal was long ago
    with pipeline_executes(redis) as executes:
        beat.tick()
    beat.stop()
    assert executes == [3]  # one round trip: calls of 2, 2 and 1 renewals
    for lease in leases:
        assert redis.pttl(lease.keys.lock) > 20_000, lease.name
        lease.check()
        lease.release()
