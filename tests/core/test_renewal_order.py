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

And ``release(delay=...)`` racing a tick, for every kind: a renewal already decided on (the
tick listed the handle, or read its owner token and was sent) must not cut the release delay
short, nor report the released handle lost.
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
from celery_singleton_lock.core.heartbeat import heartbeat, renew_calls
from celery_singleton_lock.core.scripts import run_batch
from celery_singleton_lock.kinds.intervals import IntervalHandle
from celery_singleton_lock.kinds.multi import MultiLease
from celery_singleton_lock.kinds.rwlock import RWLockHandle

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


# -- a renewal already decided on when the holder releases with a delay ----------------------

#: The release delay the tests release with, and the least PTTL that shows it is intact.
DELAY = 60.0
INTACT_MS = 50_000

DELAYED: dict[str, Callable[[Any], Any]] = {
    "lease": lambda c, **o: c.lease("cool", ttl=3, **o),
    "multi": lambda c, **o: c.multi(["cool-a", "cool-b"], ttl=3, **o),
    "read": lambda c, **o: c.rwlock("cool").read(ttl=3, **o),
    "write": lambda c, **o: c.rwlock("cool").write(ttl=3, **o),
    "range": lambda c, **o: c.range_lock("cool").write(0, 10, ttl=3, **o),
}


def hold_keys(handle: Any, owner: str) -> list[bytes]:
    """The keys whose expiry is the hold's release delay."""
    if isinstance(handle, MultiLease):
        return [k.lock for k in handle.keys]
    if isinstance(handle, RWLockHandle):  # its hold's hash, and the lock hash naming it
        return [handle.keys.holder(owner), handle.keys.lock]
    if isinstance(handle, IntervalHandle):
        return [handle.keys.holder(owner)]
    return [handle.keys.lock]


def assert_delay_intact(client: LockClient, handle: Any, owner: str) -> None:
    for key in hold_keys(handle, owner):
        assert client.redis.pttl(key) > INTACT_MS, key
    if hasattr(handle, "mode") and hasattr(handle.keys, "indexes"):
        # A range hold: its index entry keeps the interval locked.
        now_ms = int(client.server_time() * 1000)
        expiry = client.redis.zscore(handle.keys.indexes[0], owner)
        assert expiry is not None and expiry - now_ms > INTACT_MS


def codes(replies: list[Any]) -> list[int]:
    return [int(code) for reply in replies for code in reply]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(DELAYED))
def test_a_tick_landing_after_a_delayed_release_keeps_the_release_delay(
    lock_client: LockClient, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The tick read the owner token and was sent; the holder released with a delay before
    it reached Redis. The renewal must not cut the delay short, nor find the handle lost."""
    handle = DELAYED[kind](lock_client)
    assert handle.acquire()
    owner = handle.owner
    real = heartbeat_module.run_batch
    sent: list[list[Any]] = []
    first = threading.Lock()

    def release_first(redis: Any, calls: Any, *replication: Any) -> list[Any]:
        if not any(owner in args for _, _, args in calls) or not first.acquire(blocking=False):
            return real(redis, calls, *replication)
        handle.release(delay=DELAY)
        replies = real(redis, calls, *replication)
        sent.append(replies)
        return replies

    monkeypatch.setattr(heartbeat_module, "run_batch", release_first)
    heartbeat().tick()
    (replies,) = sent
    assert codes(replies) and all(code <= 0 for code in codes(replies))
    assert_delay_intact(lock_client, handle, owner)
    assert not handle.lost  # a released handle is not lost for a late renewal


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(DELAYED))
def test_a_tick_that_listed_a_hold_released_since_renews_nothing(
    lock_client: LockClient, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The tick listed the handle, then the holder released with a delay (dropping its owner
    token), then the tick read the owner tokens: it renews nothing, and reports no loss."""
    lost: list[Any] = []
    handle = DELAYED[kind](lock_client, on_lost=lost.append)
    assert handle.acquire()
    owner = handle.owner
    beat = heartbeat()
    listed = beat.leases
    tester = threading.current_thread()
    released: list[bool] = []

    def list_then_release() -> list[Any]:
        leases = listed()
        if threading.current_thread() is tester and handle in leases and not released:
            handle.release(delay=DELAY)
            released.append(True)
        return leases

    monkeypatch.setattr(beat, "leases", list_then_release)
    beat.tick()
    assert released
    assert_delay_intact(lock_client, handle, owner)
    assert not handle.lost and lost == []  # released, not lost


def test_a_renewal_never_matches_an_ownerless_release_delay(lock_client: LockClient) -> None:
    """Whatever a caller sends, an empty owner token is no owner."""
    lease = lock_client.lease("cool", ttl=3)
    assert lease.acquire()
    lease.release(delay=DELAY)
    calls = [lock_client.connection.scripts.renew_call([(lease.keys.lock, "", 3000, 0)])]
    assert lock_client.connection.call(run_batch, lock_client.redis, calls) == [[-1]]
    assert lock_client.redis.pttl(lease.keys.lock) > INTACT_MS
    both = lock_client.multi(["m-a", "m-b"], ttl=3)
    assert both.acquire()
    both.release(delay=DELAY)
    calls, decode = renew_calls(lock_client, [(both, "", 3000, 0)])
    assert decode(lock_client.connection.call(run_batch, lock_client.redis, calls)) == [-1]
    assert_delay_intact(lock_client, both, "")
