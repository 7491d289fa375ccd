"""Leaving a ``with`` block whose body already gave the lock back (``release``, with or
without a delay, or ``hand_over``) is quiet, and never replaces the body's own exception."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from celery_singleton_lock import AsyncLockClient, HolderRecord, LockClient

#: Makers of a handle of each kind on a name (the multi-key lock also holds name + "2").
KINDS: dict[str, Callable[[Any, str], Any]] = {
    "lease": lambda c, n: c.lease(n, ttl=30),
    "write": lambda c, n: c.rwlock(n).write(ttl=30),
    "range": lambda c, n: c.range_lock(n).write(0, 10, ttl=30),
    "multi": lambda c, n: c.multi([n, n + "2"], ttl=30),
}


class BodyError(Exception):
    pass


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("delay", [0.0, 60.0])
def test_a_block_that_released_exits_quietly(
    lock_client: LockClient, kind: str, delay: float
) -> None:
    handle = KINDS[kind](lock_client, "a")
    with handle:
        handle.release(delay=delay)
    assert not handle.held
    handle = KINDS[kind](lock_client, "b")
    with pytest.raises(BodyError), handle:
        handle.release(delay=delay)
        raise BodyError
    assert not handle.held


def test_a_block_that_handed_over_exits_quietly(lock_client: LockClient) -> None:
    lease = lock_client.lease("n", ttl=30)
    with lease:
        lease.hand_over("claim:t1:1", ttl=60, owner_info={"task_id": "t1"})
    assert lock_client.holders("n") == [HolderRecord(owner="claim:t1:1", task_id="t1")]
    assert lock_client.release_owner("n", "claim:t1:1")
    with pytest.raises(BodyError), lease:
        lease.hand_over("claim:t1:2", ttl=60, owner_info={"task_id": "t1"})
        raise BodyError
    assert lock_client.holders("n") == [HolderRecord(owner="claim:t1:2", task_id="t1")]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("delay", [0.0, 60.0])
def test_an_async_block_that_released_exits_quietly(
    lock_client: LockClient, kind: str, delay: float
) -> None:
    async def body() -> None:
        client = AsyncLockClient.from_url(lock_client.connection.url, prefix=lock_client.prefix)
        try:
            handle = KINDS[kind](client, "a")
            async with handle:
                await handle.release(delay=delay)
            assert not handle.held
            handle = KINDS[kind](client, "b")
            with pytest.raises(BodyError):
                async with handle:
                    await handle.release(delay=delay)
                    raise BodyError
            assert not handle.held
        finally:
            await client.close()

    asyncio.run(body())
