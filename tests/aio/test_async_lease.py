"""The lease contract, the same for the sync and the asyncio client (``side``), and the two
holding against each other."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from support.async_sides import Side, eventually, run, run_with, side_fixture  # noqa: F401

from celery_singleton_lock import (
    AsyncLockClient,
    LockClient,
    LockExpired,
    LockNotHeld,
    LockTaken,
    LockTimeout,
)


async def subscribed(redis_url_client: Any, channel: bytes) -> None:
    """Until a waiter has subscribed to ``channel`` (it is then blocked inside acquire)."""

    def probe() -> bool:
        return dict(redis_url_client.pubsub_numsub(channel)).get(channel, 0) >= 1

    await eventually(lambda: asyncio.to_thread(probe), 10, "the waiter to subscribe")


def test_second_acquire_refused_until_release(side: Side) -> None:
    async def body(s: Side) -> None:
        first, second = s.lease("job"), s.lease("job")
        assert await first.acquire()
        assert first.held
        assert not await second.acquire()
        await first.release()
        assert not first.held
        assert await second.acquire()
        await second.release()

    run_with(side, body)


def test_release_of_lost_lease_raises_taken_and_keeps_the_new_owner(
    side: Side, lock_client: LockClient
) -> None:
    async def body(s: Side) -> None:
        old = s.lease("k", ttl=0.05, heartbeat=False)
        assert await old.acquire()
        new = s.lease("k")
        assert await new.acquire(wait=2)
        with pytest.raises(LockTaken):
            await old.release()
        assert await asyncio.to_thread(lock_client.redis.hget, new.keys.lock, "owner") == (
            new.owner.encode()
        )
        await new.release()

    run_with(side, body)


def test_release_after_expiry_with_nobody_holding_raises_expired(
    side: Side, lock_client: LockClient
) -> None:
    async def body(s: Side) -> None:
        lease = s.lease("k", ttl=0.05, heartbeat=False)
        assert await lease.acquire()
        lock_client.redis.delete(lease.keys.lock)
        with pytest.raises(LockExpired):
            await lease.release()
        with pytest.raises(LockNotHeld):
            await lease.release()

    run_with(side, body)


def test_extend_on_a_lost_handle_raises_its_loss_and_renews_nothing(
    side: Side, lock_client: LockClient
) -> None:
    """One state machine for both handles: a handle found lost stays lost, and extend
    raises the stored LockLost without renewing the key, even while the key is still there
    with its owner (a renewal that reached Redis too late)."""

    async def body(s: Side) -> None:
        lease = s.lease("lost-ext", ttl=0.2, heartbeat=False)
        assert await lease.acquire()
        assert lock_client.redis.pexpire(lease.keys.lock, 5_000)  # outlives the lease
        await eventually(lambda: lease.lost, 10, "the lease to run out locally")
        with pytest.raises(LockExpired) as found:
            lease.check()
        with pytest.raises(LockExpired) as extended:
            await lease.extend(60)
        assert extended.value is found.value
        assert lock_client.redis.pttl(lease.keys.lock) <= 5_000  # not renewed to 60 s
        assert lease.lost

    run_with(side, body)


def test_extend_sets_rather_than_adds_and_a_non_owner_changes_nothing(
    side: Side, lock_client: LockClient
) -> None:
    async def body(s: Side) -> None:
        lease = s.lease("ext", ttl=10, heartbeat=False)
        assert await lease.acquire()
        for _ in range(5):
            assert await lease.extend(2) == pytest.approx(2.0)
        assert lock_client.redis.pttl(lease.keys.lock) <= 2000
        await lease.release()
        old = s.lease("ext2", ttl=0.05, heartbeat=False)
        assert await old.acquire()
        new = s.lease("ext2", ttl=5, heartbeat=False)  # no renewal between the two reads
        assert await new.acquire(wait=2)
        pttl = lock_client.redis.pttl(new.keys.lock)
        with pytest.raises(LockTaken):
            await old.extend(100)
        assert old.lost
        assert lock_client.redis.pttl(new.keys.lock) <= pttl
        await new.release()

    run_with(side, body)


def test_heartbeat_keeps_a_short_lease_alive(side: Side, lock_client: LockClient) -> None:
    async def body(s: Side) -> None:
        lease = s.lease("hb", ttl=0.3)
        assert await lease.acquire()
        deadline = time.monotonic() + 1.5  # five ttls
        while time.monotonic() < deadline:
            assert lock_client.redis.exists(lease.keys.lock)
            lease.check()
            await asyncio.sleep(0.05)  # the time passing is the test
        assert not lock_client.lease("hb").acquire()
        await lease.release()

    run_with(side, body)


def test_without_heartbeat_the_lease_runs_out(side: Side) -> None:
    async def body(s: Side) -> None:
        lease = s.lease("nohb", ttl=0.1, heartbeat=False)
        assert await lease.acquire()
        other = s.lease("nohb")
        assert await other.acquire(wait=2)
        assert lease.lost
        with pytest.raises(LockExpired):
            lease.check()
        await other.release()

    run_with(side, body)


def test_max_hold_stops_renewal(side: Side) -> None:
    async def body(s: Side) -> None:
        lease = s.lease("capped", ttl=0.2, max_hold=0.4)
        assert await lease.acquire()
        started = time.monotonic()
        other = s.lease("capped")
        assert await other.acquire(wait=3)
        assert 0.35 <= time.monotonic() - started < 2.0
        await other.release()

    run_with(side, body)


def test_release_delay_keeps_the_name_locked(side: Side) -> None:
    async def body(s: Side) -> None:
        lease = s.lease("report")
        assert await lease.acquire()
        await lease.release(delay=0.5)
        released = time.monotonic()
        other = s.lease("report")
        assert not await other.acquire()
        assert await other.acquire(wait=5)
        assert time.monotonic() - released >= 0.45
        await other.release()

    run_with(side, body)


def test_waiter_is_woken_by_the_release_not_its_hint(side: Side, lock_client: LockClient) -> None:
    async def body(s: Side) -> None:
        holder = s.lease("handoff", ttl=30)
        assert await holder.acquire()
        waiter = s.lease("handoff")
        waiting = asyncio.ensure_future(waiter.acquire(wait=20))
        await subscribed(lock_client.redis, holder.keys.channel)
        released_at = time.monotonic()
        await holder.release()
        assert await waiting
        # Far below the 30 s lease: woken by the release's PUBLISH.
        assert time.monotonic() - released_at < 1.0
        await waiter.release()

    run_with(side, body)


def test_waiter_gives_up_on_time_and_context_manager_raises_timeout(side: Side) -> None:
    async def body(s: Side) -> None:
        holder = s.lease("busy", ttl=30)
        assert await holder.acquire()
        started = time.monotonic()
        assert not await s.lease("busy").acquire(wait=0.5)
        assert 0.5 <= time.monotonic() - started < 1.5
        with pytest.raises(LockTimeout) as info:
            async with s.lease("busy", wait=0.1):
                pass
        assert info.value.name == "busy"
        await holder.release()

    run_with(side, body)


def test_tokens_strictly_increase_across_both_clients(
    lock_redis_url: str, lock_prefix: str
) -> None:
    async def body() -> None:
        sync = LockClient.from_url(lock_redis_url, prefix=lock_prefix)
        aio = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        tokens = []
        try:
            for _ in range(3):
                async with aio.lease("fenced") as lease:
                    tokens.append(lease.token)
                with sync.lease("fenced") as other:
                    tokens.append(other.token)
            expiring = aio.lease("fenced", ttl=0.05, heartbeat=False)
            assert await expiring.acquire()
            tokens.append(expiring.token)
            sync.redis.delete(expiring.keys.lock, expiring.keys.fence)  # cleared by hand
            async with aio.lease("fenced") as lease:
                tokens.append(lease.token)
        finally:
            sync.close()
            await aio.close()
        assert all(isinstance(t, int) for t in tokens)
        assert tokens == sorted(set(tokens)), tokens

    run(body())


def test_async_and_sync_leases_exclude_each_other(lock_redis_url: str, lock_prefix: str) -> None:
    async def body() -> None:
        sync = LockClient.from_url(lock_redis_url, prefix=lock_prefix)
        aio = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        try:
            async with aio.lease("shared"):
                assert not sync.lease("shared").acquire()
                # A sync waiter (in a thread) is woken by the async release.
                waiting = asyncio.ensure_future(asyncio.to_thread(sync.lease("shared").acquire, 20))
                await subscribed(sync.redis, aio.lease("shared").keys.channel)
            assert await waiting
            # ...and an async waiter by the sync release.
            held = sync.lease("other")
            assert held.acquire()
            waiter = aio.lease("other")
            waiting = asyncio.ensure_future(waiter.acquire(wait=20))
            await subscribed(sync.redis, waiter.keys.channel)
            assert not waiting.done()
            await asyncio.to_thread(held.release)
            assert await waiting
            await waiter.release()
        finally:
            sync.close()
            await aio.close()

    run(body())


def test_a_web_handler_and_a_task_exclude_each_other(lock_redis_url: str, lock_prefix: str) -> None:
    """The example of docs/asyncio.md, as written there."""

    async def main() -> None:
        web = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        worker = LockClient.from_url(lock_redis_url, prefix=lock_prefix)
        async with web.lease("report") as lease:
            assert not worker.lease("report").acquire()
            assert lease.token is not None
        assert worker.lease("report").acquire()
        worker.close()
        await web.close()

    asyncio.run(main())
