"""Fair leases on the asyncio client.

``fair=True`` behaves as the sync client's (tests/core/test_lease_fair.py drives the scripts'
interleavings): a blocked acquire queues and a release hands it the lease. What is the async
client's own is tested here: sync and async waiters in one queue, a waiter cancelled while
queued, and one cancelled after a release handed it the lease but before its task saw it.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio
from support.async_sides import Side, eventually, run, run_with, side_fixture  # noqa: F401
from support.lost_cancellation import LosingConnection
from support.proxies import HoldingProxy

from celery_singleton_lock import (
    AsyncLockClient,
    ConfigurationError,
    LockBackendError,
    LockClient,
)
from celery_singleton_lock.aio.connection import AsyncConnection
from celery_singleton_lock.aio.lease import AsyncLease
from celery_singleton_lock.embedded import free_port


def waiter_keys(lock_client: LockClient, base: bytes) -> list[bytes]:
    """The fair waiters' own keys under a lock's ``base`` (registrations, hand-off lists)."""
    pattern = re.sub(rb"([*?\[\]\\])", rb"\\\1", base)
    return [k for part in (b"w:*", b"m:*") for k in lock_client.redis.scan_iter(pattern + part)]


async def queued(lock_client: LockClient, queue: bytes, count: int) -> None:
    def probe() -> bool:
        return int(lock_client.redis.llen(queue)) == count

    await eventually(lambda: asyncio.to_thread(probe), 10, f"{count} waiter(s) to queue")


def test_releases_hand_the_lease_to_queued_waiters_oldest_first(
    side: Side, lock_client: LockClient
) -> None:
    async def body(s: Side) -> None:
        holder = s.lease("fair", ttl=30)
        assert await holder.acquire()
        queue = holder.keys.base + b"queue"
        order: list[int] = []
        waiters = [s.lease("fair", ttl=30, fair=True) for _ in range(3)]

        async def wait_then_release(i: int) -> None:
            assert await waiters[i].acquire(wait=20)
            order.append(i)
            await waiters[i].release()

        tasks = []
        for i in range(3):
            tasks.append(asyncio.ensure_future(wait_then_release(i)))
            await queued(lock_client, queue, i + 1)  # arrival order is queue order
        released_at = time.monotonic()
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
        assert order == [0, 1, 2]
        assert time.monotonic() - released_at < 10  # handed over, not found at a 30 s hint
        tokens = [holder.token] + [w.token for w in waiters]
        assert tokens == sorted(tokens) and len(set(tokens)) == 4
        assert not lock_client.redis.exists(holder.keys.lock, queue)

    run_with(side, body)


def test_sync_and_async_fair_waiters_share_one_queue(
    lock_redis_url: str, lock_prefix: str, lock_client: LockClient
) -> None:
    async def body() -> None:
        aclient = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        holder = lock_client.lease("mixed", ttl=30)
        assert holder.acquire()
        queue = holder.keys.base + b"queue"
        sync_waiter = lock_client.lease("mixed", ttl=30, fair=True)
        async_waiter = aclient.lease("mixed", ttl=30, fair=True)
        try:
            first = asyncio.ensure_future(async_waiter.acquire(wait=20))
            await queued(lock_client, queue, 1)
            second = asyncio.ensure_future(asyncio.to_thread(sync_waiter.acquire, 20))
            await queued(lock_client, queue, 2)
            await asyncio.to_thread(holder.release)  # a sync release hands to the async one
            assert await asyncio.wait_for(first, 20)
            assert not second.done()
            await async_waiter.release()  # and an async release to the sync one
            assert await asyncio.wait_for(second, 20)
            assert sync_waiter.token is not None and async_waiter.token is not None
            assert sync_waiter.token > async_waiter.token > (holder.token or 0)
            sync_waiter.release()
        finally:
            await aclient.close()

    run(body())


def test_fair_wait_that_times_out_leaves_no_trace(lock_client: LockClient) -> None:
    async def body() -> None:
        aclient = AsyncLockClient(lock_client_async(lock_client), prefix=lock_client.prefix)
        holder = lock_client.lease("fair-t", ttl=30)
        assert holder.acquire()
        waiter = aclient.lease("fair-t", fair=True)
        try:
            assert not await waiter.acquire(wait=0.3)
            base = holder.keys.base
            assert lock_client.redis.llen(base + b"queue") == 0
            assert not waiter_keys(lock_client, base)
            holder.release()
            assert not lock_client.redis.exists(holder.keys.lock)  # nobody was handed it
        finally:
            await aclient.close()

    run(body())


def test_cancelled_fair_waiter_leaves_the_queue(lock_client: LockClient) -> None:
    async def body() -> None:
        aclient = AsyncLockClient(lock_client_async(lock_client), prefix=lock_client.prefix)
        holder = lock_client.lease("fair-c", ttl=30)
        assert holder.acquire()
        queue = holder.keys.base + b"queue"
        waiter = aclient.lease("fair-c", fair=True)
        try:
            task = asyncio.ensure_future(waiter.acquire(wait=20))
            await queued(lock_client, queue, 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert lock_client.redis.llen(queue) == 0
            assert not waiter_keys(lock_client, holder.keys.base)
            holder.release()
            assert not lock_client.redis.exists(holder.keys.lock)
            assert not waiter.held
        finally:
            await aclient.close()

    run(body())


@pytest.fixture
def proxy(lock_client: LockClient) -> Iterator[HoldingProxy]:
    """A proxy in front of the tests' Redis that can keep a reply from the async client."""
    proxied = HoldingProxy(int(lock_client.redis.connection_pool.connection_kwargs["port"]))
    yield proxied
    proxied.close()


def test_waiter_cancelled_after_being_handed_the_lease_gives_it_back(
    lock_client: LockClient, proxy: HoldingProxy
) -> None:
    """The interleaving: a release hands the lease over, and the waiter's task is cancelled
    before it has read the reply that says so (its BLPOP's, or its refresh's). The cancelled
    acquire must not leave the name held, unrenewed, until its ttl runs out."""

    async def body() -> None:
        aclient = AsyncLockClient.from_url(proxy.url, prefix=lock_client.prefix)
        holder = lock_client.lease("fair-h", ttl=30)
        assert holder.acquire()
        queue = holder.keys.base + b"queue"
        waiter = aclient.lease("fair-h", ttl=30, fair=True)
        try:
            task = asyncio.ensure_future(waiter.acquire(wait=20))
            await queued(lock_client, queue, 1)
            (attempt,) = lock_client.redis.lrange(queue, 0, -1)  # the waiter's owner token
            proxy.hold_next_reply()
            holder.release()  # hands the lease to the waiter: its owner now holds the name
            assert lock_client.redis.hget(holder.keys.lock, "owner") == attempt
            assert await asyncio.to_thread(proxy.holding.wait, 10)
            task.cancel()
            assert await outcome(task) == "cancelled"
            assert not waiter.held
            assert not lock_client.redis.exists(holder.keys.lock)  # given back
            assert lock_client.redis.llen(queue) == 0
            assert lock_client.lease("fair-h").acquire()
        finally:
            await aclient.close()

    run(body())


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "pubsub"])
def test_acquire_whose_cancellation_redis_py_lost_undoes_all_its_attempt_did(
    lock_client: LockClient, proxy: HoldingProxy, fair: bool
) -> None:
    """The interleaving above, with the cancellation lost on its way into the attempt's
    round trip (as redis-py loses one now and then): the attempt's call goes on waiting for
    its reply and runs into the socket's timeout. The acquire raises the cancellation (where
    the task can tell one was asked for), and the undo runs to its end: the waiter handed
    the lease gives it back, the one that took the free name releases it."""

    async def body() -> None:
        conn = LosingConnection(
            redis.asyncio.Redis.from_url(proxy.url, socket_timeout=1), lock_client.prefix
        )
        holder = lock_client.lease("lost", ttl=30)
        if fair:
            assert holder.acquire()
        waiter = AsyncLease(conn, "lost", ttl=30, fair=fair)
        lock_key = waiter.keys.lock
        queue = waiter.keys.base + b"queue"
        try:
            await warm_up(conn)  # the scripts loaded: the next reply is the attempt's
            proxy.hold_next_reply()
            conn.lose_next_cancellation()
            task = asyncio.ensure_future(waiter.acquire(wait=20))
            assert await asyncio.to_thread(proxy.holding.wait, 10)
            if fair:
                (attempt,) = lock_client.redis.lrange(queue, 0, -1)  # the waiter's owner token
                holder.release()  # hands the lease to the queued waiter
                assert lock_client.redis.hget(lock_key, "owner") == attempt
            else:  # the attempt took the free name
                assert lock_client.redis.hget(lock_key, "owner") is not None
            task.cancel()
            try:
                ended = await outcome(task)
            except LockBackendError:
                ended = "backend error"
            assert conn.lost.is_set()
            # Task.cancelling() (3.11) is what tells the runner a cancellation was asked.
            assert ended == ("cancelled" if hasattr(task, "cancelling") else "backend error")
            assert not waiter.held
            assert not lock_client.redis.exists(lock_key)
            assert lock_client.redis.llen(queue) == 0
            assert not waiter_keys(lock_client, waiter.keys.base)
        finally:
            await conn.close()

    run(body())


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "pubsub"])
def test_acquire_cancelled_with_its_first_attempt_unread_leaves_nothing_held(
    lock_client: LockClient, proxy: HoldingProxy, fair: bool
) -> None:
    """The interleaving: the first attempt of a waiting acquire runs on the server (a fair
    one queues and registers; on a free name it takes it) and the task is cancelled before
    it reads the reply. A fair waiter is then handed the lease by the holder's release.
    Whatever the attempt did is undone."""

    async def body() -> None:
        aclient = AsyncLockClient.from_url(proxy.url, prefix=lock_client.prefix)
        holder = lock_client.lease("first", ttl=30)
        if fair:
            assert holder.acquire()
        waiter = aclient.lease("first", ttl=30, fair=fair)
        lock_key = waiter.keys.lock
        queue = waiter.keys.base + b"queue"
        try:
            await warm_up(aclient)  # the scripts loaded: the next reply is the attempt's
            proxy.hold_next_reply()
            task = asyncio.ensure_future(waiter.acquire(wait=20))
            assert await asyncio.to_thread(proxy.holding.wait, 10)
            if fair:
                (attempt,) = lock_client.redis.lrange(queue, 0, -1)  # the waiter's owner token
                holder.release()  # hands the lease to the queued waiter
                assert lock_client.redis.hget(lock_key, "owner") == attempt
            else:  # the attempt took the free name
                assert lock_client.redis.hget(lock_key, "owner") is not None
            task.cancel()
            assert await outcome(task) == "cancelled"
            assert not waiter.held
            assert not lock_client.redis.exists(lock_key)
            assert lock_client.redis.llen(queue) == 0
            assert not waiter_keys(lock_client, waiter.keys.base)
        finally:
            await aclient.close()

    run(body())


def test_fair_must_be_a_bool() -> None:
    async def body() -> None:
        client = AsyncLockClient.from_url(f"redis://127.0.0.1:{free_port()}/0")
        with pytest.raises(ConfigurationError) as info:
            client.lease("job", fair="yes")  # type: ignore[arg-type]
        assert info.value.argument == "fair"
        await client.close()

    run(body())


def lock_client_async(lock_client: LockClient) -> Any:
    """A ``redis.asyncio`` client of the server ``lock_client`` talks to."""
    import redis.asyncio

    kwargs = lock_client.redis.connection_pool.connection_kwargs
    return redis.asyncio.Redis(host=kwargs["host"], port=kwargs["port"], db=kwargs.get("db", 0))


async def warm_up(client: AsyncLockClient | AsyncConnection) -> None:
    """A pooled connection open and the lease scripts loaded."""
    lease = AsyncLease(client, "warm-up")
    assert await lease.acquire()
    await lease.release()


async def outcome(future: asyncio.Future[Any]) -> str:
    try:
        return str(await future)
    except asyncio.CancelledError:
        return "cancelled"


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "pubsub"])
def test_waits_cancelled_at_random_moments_always_raise_and_leave_nothing(
    lock_client: LockClient, fair: bool
) -> None:
    """A cancellation can land anywhere in a wait: in an attempt's round trip, in BLPOP, in a
    sleep. redis-py loses one now and then (the command returns its reply instead): the
    acquire must raise it all the same, and leave no queue entry or registration."""

    async def body() -> None:
        aclient = AsyncLockClient(lock_client_async(lock_client), prefix=lock_client.prefix)
        holder = lock_client.lease("random", ttl=30)
        assert holder.acquire()
        base = holder.keys.base
        rng = random.Random(7)
        try:
            for _ in range(150):
                waiter = aclient.lease("random", fair=fair)
                task = asyncio.ensure_future(waiter.acquire(wait=5))
                # Mostly within the first round trips (a few hundred µs), where redis-py
                # loses a cancellation most often; else anywhere in the refresh cycle.
                await asyncio.sleep(rng.choice((0, 0.0002, 0.0005, 0.001, rng.uniform(0, 0.3))))
                task.cancel()
                assert await outcome(task) == "cancelled"
                assert not waiter.held
                assert lock_client.redis.llen(base + b"queue") == 0
                assert not waiter_keys(lock_client, base)
                assert lock_client.redis.hget(holder.keys.lock, "owner") == (
                    holder.owner.encode()  # type: ignore[union-attr]
                )
        finally:
            holder.release()
            await aclient.close()

    run(body())
