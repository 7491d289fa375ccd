"""``extend()`` racing the heartbeat's own tick, driven step by step.

The tick reads the lease length it renews to (ttl 1 s) and is sent; ``extend(60)`` runs in
between. Two interleavings, sync and asyncio:

- *landing late*: the tick reaches Redis after the extend. It must not put the lease back
  to 1 s (the heartbeat now ticks every 20 s: the lease would die, and another client take
  the name while this handle still says it holds it).
- *read late*: the tick ran on Redis before the extend, and its reply is applied after the
  extend's. The handle must not go back to its 1 s view of the lease (it would be found
  lost, while Redis has it for 60 s).

The heartbeat's script call is wrapped so that the extend runs at the chosen point; every
later tick is held back until the test ends, so none repairs what the raced one did.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from celery_singleton_lock import AsyncLockClient, LockClient
from celery_singleton_lock.aio.heartbeat import heartbeat as async_heartbeat
from celery_singleton_lock.core import heartbeat as heartbeat_module
from celery_singleton_lock.core.heartbeat import heartbeat

KINDS: dict[str, Callable[[Any], Any]] = {
    "lease": lambda c: c.lease("n", ttl=1),
    "read": lambda c: c.rwlock("n").read(ttl=1),
    "range": lambda c: c.range_lock("n").write(0, 10, ttl=1),
    "multi": lambda c: c.multi(["n", "n2"], ttl=1),
}


def pttl(lock_client: LockClient, handle: Any) -> int:
    """The ms the server gives ``handle``'s hold (the least over a multi-key lock's names)."""
    redis = lock_client.redis
    if hasattr(handle, "names"):
        return min(redis.pttl(keys.lock) for keys in handle.keys)
    if hasattr(handle, "mode"):
        return int(redis.pttl(handle.keys.holder(handle.owner)))
    return int(redis.pttl(handle.keys.lock))


def renews(calls: Any, handle: Any) -> bool:
    """Whether the script ``calls`` renew ``handle`` (its owner token is an argument)."""
    return any(handle.owner in args for _, _, args in calls)


@pytest.fixture
def later_ticks_held() -> Iterator[threading.Event]:
    """Set at the end of the test: lets the held-back ticks go."""
    done = threading.Event()
    yield done
    done.set()


def race(
    monkeypatch: pytest.MonkeyPatch,
    handle: Any,
    landing: str,
    done: threading.Event,
) -> threading.Event:
    """Wrap the heartbeat's script call: the first one runs ``handle.extend(60)`` before
    its send (``landing="late"``) or after it (``"read late"``); later ones wait for
    ``done``. Calls renewing other handles go through. Returns an Event set once the first
    call has returned."""
    real = heartbeat_module.run_batch
    raced = threading.Event()
    first = threading.Lock()

    def extend() -> None:
        thread = threading.Thread(target=handle.extend, args=(60,))
        thread.start()
        thread.join(30)

    def wrapped(redis: Any, calls: Any, *replication: Any) -> list[Any]:
        if not renews(calls, handle):
            return real(redis, calls, *replication)
        if not first.acquire(blocking=False):
            done.wait(60)
            return real(redis, calls, *replication)
        try:
            if landing == "late":
                extend()
                return real(redis, calls, *replication)
            replies = real(redis, calls, *replication)
            extend()
            return replies
        finally:
            raced.set()

    monkeypatch.setattr(heartbeat_module, "run_batch", wrapped)
    return raced


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_tick_landing_after_extend_does_not_shorten_the_lease(
    lock_client: LockClient,
    monkeypatch: pytest.MonkeyPatch,
    later_ticks_held: threading.Event,
    kind: str,
) -> None:
    handle = KINDS[kind](lock_client)
    assert handle.acquire()
    raced = race(monkeypatch, handle, "late", later_ticks_held)
    ticker = threading.Thread(target=heartbeat().tick, daemon=True)
    ticker.start()
    assert raced.wait(30)
    assert pttl(lock_client, handle) > 50_000  # the extend's, not the stale tick's 1 s
    assert handle.held
    time.sleep(1.5)  # past the stale tick's 1 s: the lease is still there, and held
    assert pttl(lock_client, handle) > 45_000
    assert handle.held
    handle.check()
    later_ticks_held.set()
    # The tick's thread is done before the client closes (a tick held back on a closed
    # client would fail in its thread).
    ticker.join(30)
    assert not ticker.is_alive()
    handle.release()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_tick_read_after_extend_does_not_shorten_the_handles_view(
    lock_client: LockClient,
    monkeypatch: pytest.MonkeyPatch,
    later_ticks_held: threading.Event,
    kind: str,
) -> None:
    handle = KINDS[kind](lock_client)
    assert handle.acquire()
    raced = race(monkeypatch, handle, "read late", later_ticks_held)
    ticker = threading.Thread(target=heartbeat().tick, daemon=True)
    ticker.start()
    assert raced.wait(30)
    time.sleep(1.5)  # past the stale tick's 1 s, before the extend's 60 s
    assert pttl(lock_client, handle) > 45_000
    assert handle.held
    handle.check()
    later_ticks_held.set()
    # The tick's thread is done before the client closes (a tick held back on a closed
    # client would fail in its thread).
    ticker.join(30)
    assert not ticker.is_alive()
    handle.release()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("landing", ["late", "read late"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_async_tick_racing_extend_keeps_the_extended_lease(
    lock_client: LockClient, kind: str, landing: str
) -> None:
    async def body() -> None:
        client = AsyncLockClient.from_url(lock_client.connection.url, prefix=lock_client.prefix)
        done = asyncio.Event()
        try:
            handle = KINDS[kind](client)
            assert await handle.acquire()
            conn = client.connection
            real = conn.batch
            raced = asyncio.Event()
            state = {"first": True, "extending": False}

            async def extend() -> None:
                state["extending"] = True
                try:
                    await handle.extend(60)
                finally:
                    state["extending"] = False

            async def wrapped(calls: Any) -> list[Any]:
                if state["extending"] or not renews(calls, handle):
                    return list(await real(calls))
                if not state["first"]:
                    await done.wait()
                    return list(await real(calls))
                state["first"] = False
                try:
                    if landing == "late":
                        await extend()
                        return list(await real(calls))
                    replies = list(await real(calls))
                    await extend()
                    return replies
                finally:
                    raced.set()

            conn.batch = wrapped  # type: ignore[method-assign]
            await async_heartbeat().tick()
            assert raced.is_set()
            await asyncio.sleep(1.5)  # past the stale tick's 1 s
            assert pttl(lock_client, handle) > 45_000
            assert handle.held
            handle.check()
            done.set()
            conn.batch = real  # type: ignore[method-assign]
            await handle.release()
        finally:
            done.set()
            await client.close()

    asyncio.run(body())
