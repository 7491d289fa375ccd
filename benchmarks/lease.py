"""Section ``lease``: the exclusive lease against the floor and the usual Redis locks.

- throughput: uncontended acquire+release pairs per second on one connection;
- server time: microseconds of Redis time per pair (``INFO commandstats``), ours vs. the floor;
- hand-off: a holder releases while a waiter in another process is blocked in acquire;
- heartbeat: many leases held, renewed in one round trip per tick.
"""

from __future__ import annotations

import argparse
import gc
import random
import time

from .anchors import ANCHORS, DIAGNOSTICS, Handle, release_timed
from .context import Context
from .registry import section
from .renewal import measure_renewal, tick_median_ms
from .report import Table, verdict
from .server_time import TOP_LEVEL, server_us_per_pair
from .stats import median, paired_ratio, percentile
from .waiter import Waiter

#: Lease length for throughput and hand-off: long, so nothing expires or renews meanwhile.
TTL = 30.0
#: How long a hand-off waiter may wait before it gives up (an error: it should never).
WAIT = 20.0
#: The holder releases SETTLE + uniform(0, JITTER) s after the waiter said it is about to
#: block: the settle lets it block, the jitter puts the release at a random point of any
#: polling interval (redis-py's 0.1 s) instead of always the same one.
SETTLE = 0.02
JITTER = 0.1
HANDOFF_WARMUP = 3

#: Figures measured before the project started: (ratio to floor, hand-off median ms).
REFERENCE = {"redis-py": (0.80, 51.0), "python-redis-lock": (0.59, 1.0), "pottery": (0.29, 52.0)}
#: Ours against the floor's pairs/s (the goal).
TARGET_RATIO = 0.95
#: Ours against redis-py's Lock, each a new lock object per use (the guard rail).
TARGET_REDIS_PY_RATIO = 0.9
TARGET_HANDOFF_P95_MS = 1.5
#: Ours' server time per pair against the floor's.
TARGET_SERVER_RATIO = 2.0
RENEWAL_TTL = 3.0


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--rounds", type=int, help="throughput rounds per lock (3 quick, 15 full)")
    group.add_argument("--pairs", type=int, help="pairs per throughput round (300 / 1000)")
    group.add_argument("--handoffs", type=int, help="measured hand-offs per lock (10 / 50)")
    group.add_argument("--leases", type=int, help="leases held for the heartbeat (1000)")
    group.add_argument("--ticks", type=int, help="heartbeat ticks timed directly (5 / 20)")


@section("lease", "Exclusive lease vs. other Redis locks", add_arguments=add_arguments, order=10)
def run(ctx: Context) -> list[Table]:
    rounds = ctx.pick("rounds", 3, 15)
    pairs = ctx.pick("pairs", 300, 1000)
    handoffs = ctx.pick("handoffs", 10, 50)
    leases = ctx.pick("leases", 1000, 1000)
    timed_ticks = ctx.pick("ticks", 5, 20)

    rates = measure_throughput(ctx, rounds, pairs)
    ratios = {key: paired_ratio(values, rates["floor"]) for key, values in rates.items()}
    speed = Table(
        f"Uncontended acquire+release, one connection (median of {rounds} rounds x {pairs} pairs)",
        ["lock", "pairs/s", "x floor", "x floor before"],
        numeric=frozenset({1, 2, 3}),
    )
    labels = {key: a.label for key, a in {**ANCHORS, **DIAGNOSTICS}.items()}
    for key, values in rates.items():
        before = REFERENCE.get(key)
        speed.add(
            labels[key],
            f"{median(values):,.0f}",
            f"{ratios[key]:.2f}",
            f"{before[0]:.2f}" if before else "",
        )
    speed.notes.append("every lock is a new lock object per acquire, as its docs use it")
    speed.notes.append(
        "x floor: median over rounds of (pairs/s / the floor's pairs/s in the same round);"
        " the locks take turns within each round, after a warm-up of each"
    )
    speed.notes.append("rows in brackets are diagnostics of ours, not competitors")

    server_us = measure_server_time(ctx, pairs)
    server = Table(
        f"Server time per acquire+release pair (INFO commandstats, least of 3 x {pairs} pairs)",
        ["lock", "server us/pair", "x floor"],
        numeric=frozenset({1, 2}),
    )
    for key, value in server_us.items():
        server.add(labels[key], f"{value:.1f}", f"{value / server_us['floor']:.2f}")
    server.notes.append(
        "summed over the commands a lock sends itself (a script's time includes what it calls)"
    )
    if not ctx.embedded:
        server.notes.append("server counts include any other client of the shared REDIS_URL")

    latencies = {key: measure_handoff(ctx, key, handoffs) for key in ANCHORS}
    handoff = Table(
        f"Hand-off to a waiter in another process ({handoffs} hand-offs each)",
        ["lock", "waiter learns it is free by", "median ms", "p95 ms", "median before"],
        numeric=frozenset({2, 3, 4}),
    )
    for key, values in latencies.items():
        before = REFERENCE.get(key)
        handoff.add(
            ANCHORS[key].label,
            ANCHORS[key].waits_by,
            f"{median(values):.2f}",
            f"{percentile(values, 95):.2f}",
            f"{before[1]:.1f}" if before else "",
        )
    handoff.notes.append(
        "latency: holder's time.monotonic() just before release() -> waiter's right after "
        "its acquire returned (one system-wide clock)"
    )
    handoff.notes.append(
        "asyncio rows: the event loop runs only during each call here, so their times are"
        " taken inside the coroutines (before the release is awaited, after the acquire"
        " returned), as an application's running loop would see them"
    )
    handoff.notes.append(
        f"the holder releases {SETTLE * 1000:.0f}-{(SETTLE + JITTER) * 1000:.0f} ms (random)"
        " after the waiter blocked, so polling locks are caught at a random point of their"
        " interval"
    )

    renewal = measure_renewal(
        ctx,
        leases,
        RENEWAL_TTL,
        natural_ticks=ctx.pick("natural_ticks", 2, 3),
        timed_ticks=timed_ticks,
    )
    beat = Table(
        f"Heartbeat: {renewal.leases} leases held in one process, ttl {renewal.ttl:g} s",
        ["measure", "value"],
        numeric=frozenset({1}),
    )
    beat.add("heartbeat-thread ticks observed", renewal.natural_ticks)
    beat.add("round trips per tick (client writes)", f"{renewal.writes_per_tick:g}")
    beat.add("EVALSHA+EVAL per tick (server commandstats)", f"{renewal.scripts_per_tick:g}")
    beat.add(
        f"tick() time, median of {len(renewal.tick_ms)} (ms)", f"{tick_median_ms(renewal):.2f}"
    )
    beat.add("tick() time, slowest (ms)", f"{max(renewal.tick_ms):.2f}")
    beat.add("leases still held at the end", f"{renewal.held_after}/{renewal.leases}")
    beat.add(f"time to acquire the {renewal.leases} leases (s)", f"{renewal.acquire_seconds:.2f}")
    if not ctx.embedded:
        beat.notes.append("server counts include any other client of the shared REDIS_URL")

    handoff_ms = median(latencies["ours"])
    fair_ms = median(latencies["ours-fair"])
    fair_p95 = percentile(latencies["ours-fair"], 95)
    rival_ms = median(latencies["python-redis-lock"])
    versus_redis_py = paired_ratio(rates["ours"], rates["redis-py"])
    server_ratio = server_us["ours"] / server_us["floor"]
    one_trip = renewal.writes_per_tick == 1 and renewal.held_after == renewal.leases
    targets = Table("Targets", ["target", "measured", ""], numeric=frozenset())
    targets.add(
        f"ours >= {TARGET_REDIS_PY_RATIO:g}x redis-py Lock pairs/s, each a new one per use",
        f"{versus_redis_py:.2f}x redis-py",
        verdict(versus_redis_py >= TARGET_REDIS_PY_RATIO),
    )
    targets.add(
        f"ours >= {TARGET_RATIO}x floor pairs/s (goal)",
        f"{ratios['ours']:.2f}x",
        verdict(ratios["ours"] >= TARGET_RATIO),
    )
    targets.add(
        "hand-off median <= python-redis-lock's (fair=True)",
        f"{fair_ms:.2f} vs {rival_ms:.2f} ms",
        verdict(fair_ms <= rival_ms),
    )
    targets.add(
        f"hand-off p95 <= {TARGET_HANDOFF_P95_MS:g} ms (fair=True)",
        f"{fair_p95:.2f} ms",
        verdict(fair_p95 <= TARGET_HANDOFF_P95_MS),
    )
    targets.add(
        "hand-off median <= python-redis-lock's (default, pub/sub)",
        f"{handoff_ms:.2f} vs {rival_ms:.2f} ms",
        verdict(handoff_ms <= rival_ms),
    )
    for key, how in (("ours-async-fair", "asyncio, fair=True"), ("ours-async", "asyncio")):
        async_ms = median(latencies[key])
        targets.add(
            f"hand-off median <= python-redis-lock's ({how})",
            f"{async_ms:.2f} vs {rival_ms:.2f} ms",
            verdict(async_ms <= rival_ms),
        )
    targets.add(
        f"server us per lease pair <= {TARGET_SERVER_RATIO:g}x floor's",
        f"{server_ratio:.2f}x",
        verdict(server_ratio <= TARGET_SERVER_RATIO),
    )
    targets.add(
        f"{renewal.leases} held leases renewed in one round trip per tick",
        f"{renewal.writes_per_tick:g} round trip(s), {renewal.held_after} held",
        verdict(one_trip),
    )
    return [speed, server, handoff, beat, targets]


def measure_throughput(ctx: Context, rounds: int, pairs: int) -> dict[str, list[float]]:
    """Pairs per second of each lock, ``rounds`` times, the locks taking turns."""
    client = ctx.redis()
    prefix = ctx.prefix("throughput")
    every = {**ANCHORS, **DIAGNOSTICS}
    anchors = {key: a for key, a in every.items() if not a.handoff_only}
    handles = {
        key: anchor.make(client, prefix, f"tp-{key}", TTL) for key, anchor in anchors.items()
    }
    rates: dict[str, list[float]] = {key: [] for key in handles}
    try:
        for handle in handles.values():
            pairs_per_second(handle, max(100, pairs // 4))  # warm-up: connection, scripts
        keys = list(handles)
        for i in range(rounds):
            for key in keys[i % len(keys) :] + keys[: i % len(keys)]:
                rates[key].append(pairs_per_second(handles[key], pairs))
    finally:
        client.close()
    return rates


def measure_server_time(ctx: Context, pairs: int) -> dict[str, float]:
    """Server microseconds per uncontended pair of the floor, redis-py's Lock and ours."""
    client = ctx.redis()
    prefix = ctx.prefix("server")
    try:
        result: dict[str, float] = {}
        for key, commands in TOP_LEVEL.items():
            handle = ANCHORS[key].make(client, prefix, f"st-{key}", TTL)
            pairs_per_second(handle, max(100, pairs // 4))  # warm-up: scripts loaded

            def pair(handle: Handle = handle) -> None:
                if not handle.try_acquire():
                    raise RuntimeError("an uncontended acquire failed")
                handle.release()

            result[key] = server_us_per_pair(client, pair, commands, pairs)
    finally:
        client.close()
    return result


def pairs_per_second(handle: Handle, pairs: int) -> float:
    gc.collect()
    started = time.perf_counter()
    for _ in range(pairs):
        if not handle.try_acquire():
            raise RuntimeError("an uncontended acquire failed")
        handle.release()
    return pairs / (time.perf_counter() - started)


def measure_handoff(ctx: Context, key: str, count: int) -> list[float]:
    """Seconds from the holder's release to the waiting process holding the lock, x count."""
    client = ctx.redis()
    prefix = ctx.prefix("handoff")
    name = f"ho-{key}"
    holder = ANCHORS[key].make(client, prefix, name, TTL)
    rng = random.Random(f"{key}-handoff")
    latencies: list[float] = []
    try:
        with Waiter(key, ctx.url, prefix, name) as waiter:
            for i in range(HANDOFF_WARMUP + count):
                if not holder.acquire_blocking(WAIT):
                    raise RuntimeError(f"{key}: the holder could not take the lock")
                waiter.start_waiting(WAIT)
                time.sleep(SETTLE + rng.uniform(0, JITTER))  # let the waiter block
                released_at = release_timed(holder)
                got = waiter.acquired_at(WAIT + 10)
                if got is None:
                    raise RuntimeError(f"{key}: the waiter timed out after a release")
                if i >= HANDOFF_WARMUP:
                    latencies.append((got - released_at) * 1000)
    finally:
        holder.close()
        client.close()
    return latencies
