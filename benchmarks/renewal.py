"""Heartbeat cost: many leases held in one process, renewed by one round trip per tick."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from celery_singleton_lock import LockClient
from celery_singleton_lock.core.heartbeat import heartbeat

from .context import Context
from .stats import median


class CountingConnection(redis.Connection):
    """A connection that counts its writes: one write of a request (or of a whole pipeline)
    is followed by reading its replies, so writes = round trips."""

    writes = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.writes += 1
        super().send_packed_command(command, check_health)


@dataclass
class RenewalResult:
    leases: int
    ttl: float
    acquire_seconds: float  # to take all the leases, one by one
    natural_ticks: int  # ticks of the heartbeat thread observed
    writes_per_tick: float  # client side: round trips per tick
    scripts_per_tick: float  # server side: EVALSHA + EVAL calls per tick
    tick_ms: list[float]  # heartbeat().tick() called directly
    held_after: int  # leases still held (not lost) at the end


def script_calls(client: redis.Redis) -> int:
    """EVALSHA + EVAL calls the server has counted (INFO commandstats)."""
    stats = client.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval")
    )


def measure_renewal(
    ctx: Context, leases: int, ttl: float, natural_ticks: int, timed_ticks: int
) -> RenewalResult:
    counted = ctx.redis(connection_class=CountingConnection)
    probe = ctx.redis()
    client = LockClient(counted, prefix=ctx.prefix("renewal"))
    beat = heartbeat()
    held = [client.lease(f"held-{i}", ttl=ttl, heartbeat=True) for i in range(leases)]
    started = time.perf_counter()
    for lease in held:
        if not lease.acquire():
            raise RuntimeError(f"could not take {lease.name!r}")
    acquire_seconds = time.perf_counter() - started
    try:
        # The heartbeat thread's own ticks, every ttl / 3 s: count what each one sends, from
        # the second on (the first loads the renew script on a fresh server: NOSCRIPT).
        wait_for_ticks(beat.ticks + 1, ttl)
        ticks0, writes0, scripts0 = beat.ticks, CountingConnection.writes, script_calls(probe)
        wait_for_ticks(ticks0 + natural_ticks, ttl)
        ticks = beat.ticks - ticks0
        writes = CountingConnection.writes - writes0
        scripts = script_calls(probe) - scripts0  # INFO is no script: not counted
        # Then tick directly, with the thread stopped so nothing overlaps the timing.
        beat.stop()
        tick_ms = []
        for _ in range(timed_ticks):
            t = time.perf_counter()
            beat.tick()
            tick_ms.append((time.perf_counter() - t) * 1000)
        held_after = sum(1 for lease in held if lease.held and not lease.lost)
    finally:
        for lease in held:
            if lease.held:
                lease.release()
        counted.close()
        probe.close()
    return RenewalResult(
        leases=leases,
        ttl=ttl,
        acquire_seconds=acquire_seconds,
        natural_ticks=ticks,
        writes_per_tick=writes / ticks,
        scripts_per_tick=scripts / ticks,
        tick_ms=tick_ms,
        held_after=held_after,
    )


def wait_for_ticks(ticks: int, ttl: float) -> None:
    """Return once the heartbeat thread has ticked ``ticks`` times in all."""
    beat = heartbeat()
    deadline = time.monotonic() + (ticks - beat.ticks + 2) * ttl
    while beat.ticks < ticks:
        if time.monotonic() > deadline:
            raise RuntimeError("the heartbeat thread did not tick")
        time.sleep(0.05)  # waiting for a background timer, not for another process


def tick_median_ms(result: RenewalResult) -> float:
    return median(result.tick_ms)
