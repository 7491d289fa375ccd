"""Section ``replicated``: what ``replicas=1`` costs per lease acquire+release pair.

A master and one replica of its own (two throwaway ``redis-server`` processes on loopback,
whatever ``REDIS_URL`` says: the benchmark server has no replica). The same lease pairs on
the same master, rounds of ``replicas=0`` and ``replicas=1`` interleaved so that load on a
shared machine falls on both alike: with ``replicas=1`` each acquire and each release carry
``WAIT 1`` in their round trip and return once the replica has acknowledged the write.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from celery_singleton_lock import LockClient
from celery_singleton_lock.embedded import RedisServer

from .context import Context
from .registry import section
from .report import Table
from .stats import median

#: Lease length: long, so nothing expires or renews meanwhile.
TTL = 30.0


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--replicated-rounds", type=int, help="rounds per setting (3 / 15)")
    group.add_argument("--replicated-pairs", type=int, help="pairs per round (200 / 1000)")


@contextmanager
def master_and_replica() -> Iterator[tuple[RedisServer, RedisServer]]:
    """A master and a replica of it, the replica synced and acknowledging writes."""
    with RedisServer() as master, RedisServer() as replica:
        node = redis.Redis(port=replica.port)
        primary = redis.Redis(port=master.port)
        try:
            node.execute_command("REPLICAOF", "127.0.0.1", master.port)
            deadline = time.monotonic() + 30
            # A replica that just synced gets writes only after its first REPLCONF ACK
            # (once a second): wait until a write is acknowledged.
            while not acknowledged(primary):
                if time.monotonic() > deadline:
                    raise RuntimeError("the benchmark replica did not sync within 30 s")
            yield master, replica
        finally:
            node.close()
            primary.close()


def acknowledged(primary: redis.Redis) -> bool:
    pipe = primary.pipeline(transaction=False)
    pipe.set("bench:replication-probe", 1)
    pipe.execute_command("WAIT", 1, 100)
    return bool(pipe.execute()[1] == 1)


def pairs_seconds(client: LockClient, name: str, pairs: int) -> float:
    """Seconds per uncontended acquire+release pair on ``client``, over ``pairs`` pairs."""
    lease = client.lease(name, ttl=TTL)
    started = time.perf_counter()
    for _ in range(pairs):
        lease.acquire()
        lease.release()
    return (time.perf_counter() - started) / pairs


@section("replicated", "Replicated locks: replicas=1 vs. replicas=0", add_arguments=add_arguments)
def run(ctx: Context) -> list[Table]:
    rounds = ctx.pick("replicated_rounds", 3, 15)
    pairs = ctx.pick("replicated_pairs", 200, 1000)
    prefix = ctx.prefix("replicated")
    seconds: dict[int, list[float]] = {0: [], 1: []}
    with master_and_replica() as (master, _):
        clients = {
            replicas: LockClient.from_url(master.url, prefix=prefix, replicas=replicas)
            for replicas in seconds
        }
        try:
            for client in clients.values():
                pairs_seconds(client, "warm-up", 50)  # scripts loaded, connections made
            for _ in range(rounds):
                for replicas, client in clients.items():
                    seconds[replicas].append(pairs_seconds(client, "pair", pairs))
        finally:
            for client in clients.values():
                client.close()
    table = Table(
        "Lease acquire+release pair, master + 1 replica on loopback",
        ["setting", "µs/pair (median of rounds)", "pairs/s", "× replicas=0"],
        numeric=frozenset({1, 2, 3}),
    )
    base = median(seconds[0])
    for replicas, measured in seconds.items():
        per_pair = median(measured)
        table.add(
            f"replicas={replicas}",
            f"{per_pair * 1e6:.0f}",
            f"{1 / per_pair:.0f}",
            f"{per_pair / base:.2f}",
        )
    table.notes.append(f"{rounds} interleaved rounds of {pairs} pairs per setting")
    return [table]
