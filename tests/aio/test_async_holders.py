"""The asyncio handles' ``holders()`` and ``release_holder()``: the sync handles' (the same
steps, awaited), for every kind, on the fixtures' redis-server."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from support.async_sides import run

from celery_singleton_lock import AsyncLockClient, ConfigurationError, LockClient, LockLost
from celery_singleton_lock.aio.handle import AsyncLockHandle
from celery_singleton_lock.core.holder import HOSTNAME

KINDS = ["lease", "read", "write", "range", "multi", "semaphore"]


def make(client: AsyncLockClient, kind: str, name: str = "job", **options: Any) -> Any:
    """An asyncio handle of ``kind`` on ``name`` (not yet acquired)."""
    if kind == "lease":
        return client.lease(name, **options)
    if kind in ("read", "write"):
        return getattr(client.rwlock(name), kind)(**options)
    if kind == "range":
        return client.range_lock(name).write(0, 10, **options)
    if kind == "semaphore":
        return client.semaphore(name, 1).permit(**options)
    return client.multi([name, f"{name}-2"], **options)


@pytest.mark.parametrize("kind", KINDS)
def test_holders_names_the_holder_and_release_holder_frees_it(
    lock_redis_url: str, lock_prefix: str, kind: str
) -> None:
    async def session() -> None:
        client = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        try:
            held: AsyncLockHandle = make(client, kind, owner_info={"task_id": "t-1"})
            # A reader beside a reader is no one's way: the writer is blocked by it.
            other: AsyncLockHandle = make(client, "write" if kind == "read" else kind)
            assert await other.holders() == []
            assert await held.acquire()
            # The handle in the way sees the holder, as the sync handle would.
            assert {h.task_id for h in await other.holders()} == {"t-1"}
            assert {h.owner for h in await held.holders()} == {held.owner}
            assert not await other.acquire()

            pid = os.getpid()
            assert not await other.release_holder(task_id="t-2", pid=pid)
            assert not await other.release_holder(task_id="t-1", pid=pid, host="elsewhere")
            assert await other.release_holder(task_id="t-1", pid=pid, host=HOSTNAME)
            assert await other.holders() == []
            with pytest.raises(LockLost):
                await held.extend()
            assert await other.acquire()
            await other.release()
        finally:
            await client.close()

    run(session())


@pytest.mark.parametrize("kind", KINDS)
def test_the_sync_and_asyncio_handles_see_the_same_holders(
    lock_client: LockClient, lock_redis_url: str, lock_prefix: str, kind: str
) -> None:
    sync_handle = {
        "lease": lambda: lock_client.lease("job", owner_info={"task_id": "sync-run"}),
        "read": lambda: lock_client.rwlock("job").write(owner_info={"task_id": "sync-run"}),
        "write": lambda: lock_client.rwlock("job").write(owner_info={"task_id": "sync-run"}),
        "range": lambda: lock_client.range_lock("job").write(
            5, 6, owner_info={"task_id": "sync-run"}
        ),
        "multi": lambda: lock_client.lease("job-2", owner_info={"task_id": "sync-run"}),
        "semaphore": lambda: lock_client.semaphore("job", 1).permit(
            owner_info={"task_id": "sync-run"}
        ),
    }[kind]()
    assert sync_handle.acquire()

    async def session() -> tuple[set[str | None], set[str | None], bool]:
        client = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        try:
            handle = make(client, kind)
            seen = {h.task_id for h in await handle.holders()}
            leased = {h.task_id for h in await client.holders(sync_handle.name)}
            freed = await handle.release_holder(task_id="sync-run", pid=os.getpid())
            return seen, leased, freed
        finally:
            await client.close()

    seen, leased, freed = run(session())
    assert seen == {"sync-run"}
    assert leased == ({"sync-run"} if kind in ("lease", "multi") else set())
    assert freed
    with pytest.raises(LockLost):
        sync_handle.extend()


def test_release_holder_refuses_bad_arguments_before_any_redis_call() -> None:
    # No server listens there: a Redis call would fail with LockBackendError instead.
    async def session() -> list[str]:
        client = AsyncLockClient.from_url("redis://127.0.0.1:1/0")
        try:
            lease = client.lease("job")
            refused = []
            for arguments in ({"task_id": "", "pid": 1}, {"task_id": "t", "pid": 0}):
                with pytest.raises(ConfigurationError) as info:
                    await lease.release_holder(**arguments)  # type: ignore[arg-type]
                refused.append(info.value.argument)
            return refused
        finally:
            await client.close()

    assert asyncio.run(session()) == ["task_id", "pid"]
