"""Semaphores the same for the sync and the asyncio client (``side``), and async permits
sharing a semaphore with sync ones."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest
from support.async_sides import Side, eventually, run, run_with, side_fixture  # noqa: F401

from celery_singleton_lock import AsyncLockClient, ConfigurationError, LockClient, LockExpired
from celery_singleton_lock.aio import AsyncPermit, AsyncSemaphore


async def subscribers(client: LockClient, channel: bytes) -> int:
    replies = await asyncio.to_thread(client.redis.pubsub_numsub, channel)
    return int(dict(replies).get(channel, 0))


def test_at_most_limit_permits_and_a_release_wakes_a_waiter(
    side: Side, lock_client: LockClient
) -> None:
    async def body(s: Side) -> None:
        sem = s.semaphore("exports", 2)
        held = [sem.permit(), sem.permit()]
        for permit in held:
            assert await permit.acquire()
        assert held[0].token < held[1].token
        assert not await sem.permit().acquire()
        waiter = sem.permit()
        waiting = asyncio.ensure_future(waiter.acquire(wait=20))
        channel = waiter.keys.channel
        await eventually(lambda: subscribers(lock_client, channel), 10, "the waiter to wait")
        released = time.monotonic()
        await held[0].release()
        assert await waiting  # woken by the release, not by the 30 s expiry
        assert time.monotonic() - released < 2.0
        assert waiter.token > held[1].token
        assert not await sem.permit().acquire()
        await held[1].release()
        await waiter.release()
        assert await sem.permit().acquire()

    run_with(side, body)


def test_the_admin_lists_and_clears_permits_alike(side: Side) -> None:
    async def body(s: Side) -> None:
        sem = s.semaphore("listed", 3)
        a, b = sem.permit(), sem.permit()
        assert await a.acquire() and await b.acquire()
        locks = s.client.locks("listed")
        infos = await locks if s.kind == "async" else locks
        assert sorted(info.token for info in infos) == [a.token, b.token]
        assert {(info.kind, info.limit, info.state) for info in infos} == {("semaphore", 3, "live")}
        cleared = s.client.clear("listed", token=a.token, force=True)
        assert (await cleared) if s.kind == "async" else cleared
        with pytest.raises(LockExpired):
            await a.release()
        await b.release()

    run_with(side, body)


def test_async_and_sync_permits_share_one_semaphore(
    lock_client: LockClient, lock_redis_url: str, lock_prefix: str
) -> None:
    sync_permit = lock_client.semaphore("shared", 2).permit()
    assert sync_permit.acquire()

    async def body() -> None:
        client = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        try:
            sem = client.semaphore("shared", 2)
            assert isinstance(sem, AsyncSemaphore)
            mine = sem.permit()
            assert isinstance(mine, AsyncPermit)
            async with mine:
                assert mine.token > (sync_permit.token or 0)
                assert not await sem.permit().acquire()  # one sync + one async = 2
                assert not lock_client.semaphore("shared", 2).permit().acquire()
            assert await sem.permit().acquire()
        finally:
            await client.close()

    run(body())
    sync_permit.release()


@pytest.mark.parametrize("limit", [0, 2.5, True, None, math.inf])
def test_a_bad_limit_is_refused_before_any_redis_call(limit: Any) -> None:
    client = AsyncLockClient.from_url("redis://127.0.0.1:1/0")  # nothing listens there
    with pytest.raises(ConfigurationError) as info:
        client.semaphore("x", limit)
    assert info.value.argument == "limit"
    with pytest.raises(ConfigurationError) as info:
        client.semaphore("x", 2).permit(ttl=0)
    assert info.value.argument == "ttl"
