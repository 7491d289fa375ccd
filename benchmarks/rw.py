"""Section ``rw``: reader-writer and range locks.

- read-lock acquire+release pairs/s against the exclusive lease's, rounds interleaved;
- server time per pair (``INFO commandstats``) of a read hold against a lease;
- range acquire+release cost with 10, 1,000 and 10,000 disjoint ranges held;
- hand-off: a writer releases while a reader (own client, own thread) waits for it.
"""

from __future__ import annotations

import argparse
import gc
import threading
import time
from collections.abc import Callable
from typing import Any

from celery_singleton_lock import LockClient

from .context import Context
from .registry import section
from .report import Table, verdict
from .server_time import server_us_per_pair
from .stats import median, paired_ratio, percentile

TTL = 300.0  # long: nothing expires or renews while measured
TARGET_RATIO = 0.9
TARGET_SCALING = 2.0
TARGET_HANDOFF_MS = 2.0
#: A read pair's server time against a lease pair's.
TARGET_SERVER_RATIO = 1.5
SETTLE = 0.02
#: Alternating rounds of the server-time measure (lease, read, lease, ...), quick / full,
#: and the pairs of each: many short rounds, so that the median of the per-round ratios
#: steadies (a ratio of two minima moved by 0.5x between runs of the same code here).
SERVER_ROUNDS = (5, 30)
SERVER_PAIRS = 300


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--rw-rounds", type=int, help="throughput rounds (3 quick, 9 full)")
    group.add_argument("--rw-pairs", type=int, help="pairs per round (300 / 1000)")
    group.add_argument("--rw-handoffs", type=int, help="reader hand-offs timed (10 / 40)")
    group.add_argument(
        "--rw-server-rounds", type=int, help="server-time rounds of each (5 quick, 30 full)"
    )


@section("rw", "Reader-writer and range locks", add_arguments=add_arguments, order=30)
def run(ctx: Context) -> list[Table]:
    rounds = ctx.pick("rw_rounds", 3, 9)
    pairs = ctx.pick("rw_pairs", 300, 1000)
    handoffs = ctx.pick("rw_handoffs", 10, 40)
    client = LockClient.from_url(ctx.url, prefix=ctx.prefix("rw"))
    try:
        rates = throughput(client, rounds, pairs)
        ratio = paired_ratio(rates["read"], rates["lease"])
        speed = Table(
            f"Uncontended acquire+release (median of {rounds} rounds x {pairs} pairs)",
            ["lock", "pairs/s", "x lease"],
            numeric=frozenset({1, 2}),
        )
        for key, values in rates.items():
            speed.add(key, f"{median(values):,.0f}", f"{paired_ratio(values, rates['lease']):.2f}")

        server_rounds = ctx.pick("rw_server_rounds", *SERVER_ROUNDS)
        server_us = server_time(client, server_rounds)
        server = Table(
            f"Server time per acquire+release pair (INFO commandstats, {server_rounds}"
            f" alternating rounds x {SERVER_PAIRS} pairs)",
            ["lock", "server us/pair (least)", "median", "x lease (median of rounds)"],
            numeric=frozenset({1, 2, 3}),
        )
        server_ratio = paired_ratio(server_us["read"], server_us["lease"])
        for key, values in server_us.items():
            times = 1.0 if key == "lease" else server_ratio
            server.add(key, f"{min(values):.1f}", f"{median(values):.1f}", f"{times:.2f}")
        server.notes.append(
            "x lease: the median over rounds of the read round's time over the lease round's"
        )
        if not ctx.embedded:
            server.notes.append("server counts include any other client of the shared REDIS_URL")

        costs = range_costs(client, pairs)
        scale = Table(
            "Range acquire+release with n disjoint ranges held",
            ["ranges held", "write us/pair", "read us/pair"],
            numeric=frozenset({0, 1, 2}),
        )
        for held, (write_us, read_us) in costs.items():
            scale.add(f"{held:,}", f"{write_us:.0f}", f"{read_us:.0f}")
        scaling = costs[10_000][0] / costs[10][0]

        latencies = handoff(ctx, client, handoffs)
        hand = Table(
            f"Writer -> waiting reader hand-off ({handoffs} hand-offs)",
            ["measure", "ms"],
            numeric=frozenset({1}),
        )
        hand.add("median", f"{median(latencies):.2f}")
        hand.add("p95", f"{percentile(latencies, 95):.2f}")
        hand.notes.append("writer's monotonic clock before release -> reader's after acquire")
    finally:
        client.close()
    handoff_ms = median(latencies)
    targets = Table("Targets", ["target", "measured", ""])
    targets.add(
        f"read pairs/s >= {TARGET_RATIO}x lease", f"{ratio:.2f}x", verdict(ratio >= TARGET_RATIO)
    )
    targets.add(
        f"read pair server us <= {TARGET_SERVER_RATIO:g}x lease pair's",
        f"{server_ratio:.2f}x",
        verdict(server_ratio <= TARGET_SERVER_RATIO),
    )
    targets.add(
        f"range cost at 10,000 held <= {TARGET_SCALING:g}x at 10",
        f"{scaling:.2f}x",
        verdict(scaling <= TARGET_SCALING),
    )
    targets.add(
        f"reader hand-off median <= {TARGET_HANDOFF_MS:g} ms",
        f"{handoff_ms:.2f} ms",
        verdict(handoff_ms <= TARGET_HANDOFF_MS),
    )
    return [speed, server, scale, hand, targets]


def pairs_per_second(make: Callable[[], object], pairs: int) -> float:
    gc.collect()
    started = time.perf_counter()
    for _ in range(pairs):
        handle = make()
        if not handle.acquire():  # type: ignore[attr-defined]
            raise RuntimeError("an uncontended acquire failed")
        handle.release()  # type: ignore[attr-defined]
    return pairs / (time.perf_counter() - started)


def throughput(client: LockClient, rounds: int, pairs: int) -> dict[str, list[float]]:
    makers: dict[str, Callable[[], object]] = {
        "lease": lambda: client.lease("tp-lease", ttl=TTL, heartbeat=False),
        "read": lambda: client.rwlock("tp-rw").read(ttl=TTL, heartbeat=False),
        "write": lambda: client.rwlock("tp-rw2").write(ttl=TTL, heartbeat=False),
        "range read": lambda: client.range_lock("tp-range").read(0, 1, ttl=TTL, heartbeat=False),
    }
    for make in makers.values():
        pairs_per_second(make, max(100, pairs // 4))  # warm-up: connection, scripts
    rates: dict[str, list[float]] = {key: [] for key in makers}
    keys = list(makers)
    for i in range(rounds):
        for key in keys[i % len(keys) :] + keys[: i % len(keys)]:
            rates[key].append(pairs_per_second(makers[key], pairs))
    return rates


def server_time(client: LockClient, rounds: int) -> dict[str, list[float]]:
    """Server microseconds per uncontended pair of a lease and of a read hold (both scripts),
    per round.

    Their rounds alternate, so a busy moment of a shared machine falls on a lease round and
    the read round beside it alike: the target reads the median of the per-round ratios."""
    handles = {
        "lease": client.lease("st-lease", ttl=TTL, heartbeat=False),
        "read": client.rwlock("st-rw").read(ttl=TTL, heartbeat=False),
    }
    runs: dict[str, Callable[[], None]] = {}
    for key, handle in handles.items():

        def pair(handle: Any = handle) -> None:
            if not handle.acquire():
                raise RuntimeError("an uncontended acquire failed")
            handle.release()

        for _ in range(SERVER_PAIRS):  # warm-up: scripts loaded
            pair()
        runs[key] = pair
    result: dict[str, list[float]] = {key: [] for key in runs}
    for _ in range(rounds):
        for key, pair in runs.items():
            round_us = server_us_per_pair(client.redis, pair, ("evalsha",), SERVER_PAIRS, 1)
            result[key].append(round_us)
    return result


def range_costs(client: LockClient, pairs: int) -> dict[int, tuple[float, float]]:
    """Microseconds per acquire+release of a write and of a read range in a free gap, with
    ``n`` disjoint write ranges held on the same lock."""
    costs: dict[int, tuple[float, float]] = {}
    for n in (10, 1_000, 10_000):
        lock = client.range_lock(f"scale-{n}")
        pipe_size = 500
        held = [lock.write(i, i + 0.5, ttl=TTL, heartbeat=False) for i in range(n)]
        for start in range(0, n, pipe_size):
            for handle in held[start : start + pipe_size]:
                assert handle.acquire()
        gap = n // 2
        write = pairs_per_second(
            lambda lock=lock, gap=gap: lock.write(gap + 0.6, gap + 0.9, ttl=TTL, heartbeat=False),
            pairs,
        )
        read = pairs_per_second(
            lambda lock=lock, gap=gap: lock.read(gap + 0.6, gap + 0.9, ttl=TTL, heartbeat=False),
            pairs,
        )
        costs[n] = (1e6 / write, 1e6 / read)
        for handle in held:
            handle.release()
    return costs


def handoff(ctx: Context, client: LockClient, count: int) -> list[float]:
    """Seconds from a writer's release to a reader, blocked in acquire, holding its share."""
    other = LockClient.from_url(ctx.url, prefix=client.prefix)
    latencies: list[float] = []
    try:
        for i in range(3 + count):
            writer = client.rwlock("handoff").write(ttl=TTL, heartbeat=False)
            assert writer.acquire()
            ready = threading.Event()
            got: list[float] = []

            def read(ready: threading.Event = ready, got: list[float] = got) -> None:
                reader = other.rwlock("handoff").read(ttl=TTL, heartbeat=False)
                ready.set()
                assert reader.acquire(wait=20)
                got.append(time.monotonic())
                reader.release()

            thread = threading.Thread(target=read)
            thread.start()
            ready.wait(10)
            time.sleep(SETTLE)  # let it block
            released = time.monotonic()
            writer.release()
            thread.join(20)
            if i >= 3:
                latencies.append((got[0] - released) * 1000)
    finally:
        other.close()
    return latencies
