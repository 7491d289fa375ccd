"""Run one async test body against the sync client and the asyncio client alike.

``side`` (a fixture, parametrised ``sync`` / ``async``) makes lock handles with awaitable
``acquire``/``release``/``extend`` whichever client is underneath: the sync handles run in
a worker thread (``asyncio.to_thread``), so a blocked sync acquire does not block the loop
that is about to release the lock it waits for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from celery_singleton_lock import AsyncLockClient, LockClient
from celery_singleton_lock.aio.heartbeat import heartbeat as loop_heartbeat
from celery_singleton_lock.core.heartbeat import heartbeat as thread_heartbeat

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    """Run ``coroutine`` on a new event loop, failing after ``timeout`` seconds."""

    async def bounded() -> T:
        return await asyncio.wait_for(coroutine, timeout)

    return asyncio.run(bounded())


async def eventually(
    probe: Callable[[], Awaitable[object] | object], timeout: float, what: str
) -> None:
    """Poll ``probe`` (plain or async) until it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


class SyncHandle:
    """A sync lock handle with the async handle's awaitable methods."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def acquire(self, wait: float | None = None) -> bool:
        return bool(await asyncio.to_thread(self.handle.acquire, wait))

    async def release(self, delay: float = 0.0) -> None:
        await asyncio.to_thread(self.handle.release, delay)

    async def extend(self, ttl: float | None = None) -> float:
        return float(await asyncio.to_thread(self.handle.extend, ttl))

    async def upgrade(self, wait: float | None = None) -> bool:
        return bool(await asyncio.to_thread(self.handle.upgrade, wait))

    async def downgrade(self) -> None:
        await asyncio.to_thread(self.handle.downgrade)

    async def shrink(self, lo: float, hi: float) -> None:
        await asyncio.to_thread(self.handle.shrink, lo, hi)

    def write(self, lo: float, hi: float, **options: Any) -> SyncHandle:
        """A write nested in this upgradable range hold."""
        return SyncHandle(self.handle.write(lo, hi, **options))

    async def __aenter__(self) -> SyncHandle:
        await asyncio.to_thread(self.handle.__enter__)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.to_thread(self.handle.__exit__, *exc)

    def __getattr__(self, name: str) -> Any:  # token, held, lost, check, on_lost, _keys...
        return getattr(self.handle, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "handle":
            object.__setattr__(self, name, value)
        else:
            setattr(self.handle, name, value)


class _Factory:
    """``rwlock(name)`` / ``range_lock(name)`` / ``semaphore(name, limit)`` of a sync client,
    making wrapped handles."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock

    def __getattr__(self, mode: str) -> Callable[..., SyncHandle]:
        make = getattr(self._lock, mode)
        return lambda *args, **options: SyncHandle(make(*args, **options))


class Side:
    """One client (``kind`` is ``sync`` or ``async``) under test, made inside the loop."""

    def __init__(self, kind: str, url: str, prefix: str) -> None:
        self.kind = kind
        self.url = url
        self.prefix = prefix
        self.client: Any = None

    def open(self, **redis_kwargs: Any) -> Side:
        if self.kind == "sync":
            self.client = LockClient.from_url(self.url, prefix=self.prefix, **redis_kwargs)
        else:
            self.client = AsyncLockClient.from_url(self.url, prefix=self.prefix, **redis_kwargs)
        return self

    def lease(self, name: str, **options: Any) -> Any:
        handle = self.client.lease(name, **options)
        return SyncHandle(handle) if self.kind == "sync" else handle

    def rwlock(self, name: str) -> Any:
        lock = self.client.rwlock(name)
        return _Factory(lock) if self.kind == "sync" else lock

    def range_lock(self, name: str) -> Any:
        lock = self.client.range_lock(name)
        return _Factory(lock) if self.kind == "sync" else lock

    def semaphore(self, name: str, limit: int) -> Any:
        semaphore = self.client.semaphore(name, limit)
        return _Factory(semaphore) if self.kind == "sync" else semaphore

    def multi(self, names: list[str], **options: Any) -> Any:
        handle = self.client.multi(names, **options)
        return SyncHandle(handle) if self.kind == "sync" else handle

    async def tick(self) -> None:
        """One heartbeat tick of this side's heartbeat, applied when it returns."""
        if self.kind == "sync":
            await asyncio.to_thread(thread_heartbeat().tick)
        else:
            await loop_heartbeat().tick()

    async def close(self) -> None:
        if self.kind == "sync":
            self.client.close()
        else:
            await self.client.close()


@pytest.fixture(name="side", params=["sync", "async"])
def side_fixture(
    request: pytest.FixtureRequest, lock_redis_url: str, lock_prefix: str
) -> Iterator[Side]:
    """The client kind a parametrised test runs with (opened by the test, in its loop)."""
    yield Side(request.param, lock_redis_url, lock_prefix)


def run_with(side: Side, body: Callable[[Side], Awaitable[None]], **redis_kwargs: Any) -> None:
    """Open ``side`` on a new event loop, run ``body`` with it, close it."""

    async def main() -> None:
        side.open(**redis_kwargs)
        try:
            await body(side)
        finally:
            await side.close()

    run(main())
