"""Section ``replicated``: what ``replicas=1`` costs per acquire+release pair, for a lease,
a reader-writer write hold and an asyncio lease.

A master and one replica of its own (two throwaway ``redis-server`` processes on loopback,
whatever ``REDIS_URL`` says: the benchmark server has no replica). The same pairs on the
same master, rounds of ``replicas=0`` and ``replicas=1`` interleaved so that load on a
shared machine falls on both alike: with ``replicas=1`` each acquire and each release carry
``WAIT 1`` in their round trip and return once the replica has acknowledged the write.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis

from celery_singleton_lock import AsyncLockClient, LockClient
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


def pairs_seconds(handle: Any, pairs: int) -> float:
    """Seconds per uncontended acquire+release pair of the sync ``handle``, over ``pairs``."""
    started = time.perf_counter()
    for _ in range(pairs):
        handle.acquire()
        handle.release()
    return (time.perf_counter() - started) / pairs


def async_pairs_seconds(url: str, prefix: str, replicas: int, pairs: int) -> float:
    """Seconds per uncontended acquire+release pair of an asyncio lease on a client of its
    own (a ``redis.asyncio`` client belongs to one event loop), after a warm-up."""

    async def measure() -> float:
        client = AsyncLockClient.from_url(url, prefix=prefix, replicas=replicas)
        try:
            lease = client.lease("pair-async", ttl=TTL)
            for _ in range(WARM_UP):
                await lease.acquire()
                await lease.release()
            started = time.perf_counter()
            for _ in range(pairs):
                await lease.acquire()
                await lease.release()
            return (time.perf_counter() - started) / pairs
        finally:
            await client.close()

    return asyncio.run(measure())


#: The sync pairs measured: a handle (not yet acquired) of each lock on a client.
SYNC_LOCKS: dict[str, Callable[[LockClient], Any]] = {
    "lease": lambda client: client.lease("pair", ttl=TTL),
    "rw write": lambda client: client.rwlock("pair-rw").write(ttl=TTL),
}
ASYNC_LEASE = "asyncio lease"
#: Pairs each client runs first (scripts loaded, connections made).
WARM_UP = 50


@section(
    "replicated",
    "Replicated locks: replicas=1 vs. replicas=0 (lease, rw write, asyncio lease)",
    add_arguments=add_arguments,
)
def run(ctx: Context) -> list[Table]:
    rounds = ctx.pick("replicated_rounds", 3, 15)
    pairs = ctx.pick("replicated_pairs", 200, 1000)
    prefix = ctx.prefix("replicated")
    settings = (0, 1)
    seconds: dict[tuple[str, int], list[float]] = {
        (lock, replicas): [] for lock in (*SYNC_LOCKS, ASYNC_LEASE) for replicas in settings
    }
    with master_and_replica() as (master, _):
        clients = {
            replicas: LockClient.from_url(master.url, prefix=prefix, replicas=replicas)
            for replicas in settings
        }
        try:
            handles = {
                (lock, replicas): make(clients[replicas])
                for lock, make in SYNC_LOCKS.items()
                for replicas in settings
            }
            for handle in handles.values():
                pairs_seconds(handle, WARM_UP)
            for _ in range(rounds):
                for (lock, replicas), handle in handles.items():
                    seconds[lock, replicas].append(pairs_seconds(handle, pairs))
                for replicas in settings:
                    seconds[ASYNC_LEASE, replicas].append(
                        async_pairs_seconds(master.url, prefix, replicas, pairs)
                    )
        finally:
            for client in clients.values():
                client.close()
    table = Table(
        "Acquire+release pair, master + 1 replica on loopback",
        ["lock", "setting", "µs/pair (median of rounds)", "pairs/s", "× replicas=0"],
        numeric=frozenset({2, 3, 4}),
    )
    for lock in (*SYNC_LOCKS, ASYNC_LEASE):
        base = median(seconds[lock, 0])
        for replicas in settings:
            per_pair = median(seconds[lock, replicas])
            table.add(
                lock,
                f"replicas={replicas}",
                f"{per_pair * 1e6:.0f}",
                f"{1 / per_pair:.0f}",
                f"{per_pair / base:.2f}",
            )
    table.notes.append(f"{rounds} interleaved rounds of {pairs} pairs per lock and setting")
    return [table]
