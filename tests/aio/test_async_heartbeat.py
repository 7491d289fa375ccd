"""The asyncio heartbeat: one task per event loop, one round trip per tick however many
handles it renews; lost leases found at the next tick; holders that stop free their locks."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import redis
import redis.asyncio
from support.async_sides import eventually, run

from celery_singleton_lock import AsyncLockClient, LockClient, LockExpired
from celery_singleton_lock.aio.heartbeat import heartbeat
from celery_singleton_lock.embedded import RedisServer


class CountingConnection(redis.asyncio.Connection):
    """A connection that counts its writes: one write of a request (or of a whole pipeline)
    is followed by reading its replies, so writes = round trips."""

    writes = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.writes += 1
        await super().send_packed_command(command, check_health)


def script_calls(probe: redis.Redis) -> int:
    """EVALSHA + EVAL calls the server has counted (INFO commandstats)."""
    stats = probe.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{n}", {}).get("calls", 0)) for n in ("evalsha", "eval"))


def test_200_async_leases_are_renewed_in_one_round_trip_per_tick(
    lock_redis_url: str, lock_prefix: str
) -> None:
    probe = redis.Redis.from_url(lock_redis_url)

    async def body() -> None:
        counted = redis.asyncio.Redis.from_url(lock_redis_url, connection_class=CountingConnection)
        client = AsyncLockClient(counted, prefix=lock_prefix)
        leases = [client.lease(f"held-{i}", ttl=30) for i in range(200)]
        try:
            for lease in leases:
                assert await lease.acquire()
            beat = heartbeat()
            assert len(beat.leases()) == 200
            await beat.tick()  # loads the renew script if this server has not seen it
            for lease in leases:
                probe.pexpire(lease.keys.lock, 5000)  # as if the last renewal was long ago
            writes, scripts = CountingConnection.writes, script_calls(probe)
            await beat.tick()
            assert CountingConnection.writes - writes == 1
            assert script_calls(probe) - scripts == 1  # all 200 in one renew.lua call
            assert all(probe.pttl(lease.keys.lock) > 20_000 for lease in leases)
            assert all(lease.held for lease in leases)
        finally:
            for lease in leases:
                await lease.release()
            await client.close()

    try:
        run(body())
    finally:
        probe.close()


def test_every_kind_is_renewed_in_the_same_round_trip(
    lock_redis_url: str, lock_prefix: str
) -> None:
    probe = redis.Redis.from_url(lock_redis_url)

    async def body() -> None:
        counted = redis.asyncio.Redis.from_url(lock_redis_url, connection_class=CountingConnection)
        client = AsyncLockClient(counted, prefix=lock_prefix)
        handles = [
            client.lease("a"),
            client.rwlock("b").read(),
            client.range_lock("c").write(0, 10),
            client.multi(["d", "e"]),
        ]
        try:
            for handle in handles:
                assert await handle.acquire()
            await heartbeat().tick()
            # The holds' keys; not the fencing counters, which no renewal touches.
            holds = [k for k in probe.keys(lock_prefix + "{*") if not k.endswith(b":fence")]
            for key in holds:
                probe.pexpire(key, 5000)
            writes, scripts = CountingConnection.writes, script_calls(probe)
            await heartbeat().tick()
            assert CountingConnection.writes - writes == 1  # one pipeline
            assert script_calls(probe) - scripts == 4  # one script call per kind
            for key in holds:
                assert probe.pttl(key) > 20_000, key
            for handle in handles:
                handle.check()
                await handle.release()
        finally:
            await client.close()

    try:
        run(body())
    finally:
        probe.close()


def test_redis_restarted_empty_is_found_at_the_next_tick(restartable_redis: RedisServer) -> None:
    async def body() -> None:
        client = AsyncLockClient.from_url(restartable_redis.url, prefix="blip:")
        called: list[str] = []
        async_called = asyncio.Event()

        async def on_lost_async(handle: Any) -> None:
            async_called.set()

        plain = client.lease("plain", ttl=30, on_lost=lambda h: called.append(h.name))
        coro = client.lease("coro", ttl=30, on_lost=on_lost_async)
        ranged = client.range_lock("ranged").read(0, 1, ttl=30)
        try:
            for handle in (plain, coro, ranged):
                assert await handle.acquire()
            token = plain.token
            restartable_redis.stop()
            restartable_redis.start()
            await heartbeat().tick()
            for handle in (plain, coro, ranged):
                assert handle.lost, handle
                try:
                    handle.check()
                except LockExpired:
                    pass
                else:
                    raise AssertionError(f"{handle} not lost")
            assert called == ["plain"]
            await asyncio.wait_for(async_called.wait(), 5)
            assert heartbeat().leases() == []
            again = client.lease("plain")
            assert await again.acquire()
            assert again.token is not None and token is not None and again.token > token
            await again.release()
        finally:
            await client.close()

    run(body())


def test_a_holder_whose_task_is_cancelled_frees_the_lock_at_once(
    lock_redis_url: str, lock_prefix: str, lock_client: LockClient
) -> None:
    async def body() -> None:
        client = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        held = asyncio.Event()

        async def work() -> None:
            async with client.lease("job", ttl=30):
                held.set()
                await asyncio.Event().wait()  # a request handler that never ends

        task = asyncio.ensure_future(work())
        await asyncio.wait_for(held.wait(), 10)
        assert not lock_client.lease("job").acquire()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        other = lock_client.lease("job")
        assert other.acquire()  # released by __aexit__, not left to run out
        other.release()
        await client.close()

    run(body())


def test_a_holder_whose_loop_stopped_frees_the_lock_within_its_ttl(
    lock_redis_url: str, lock_prefix: str, lock_client: LockClient
) -> None:
    ttl = 1.0
    kept: list[Any] = []

    async def hold() -> None:
        client = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        lease = client.lease("orphan", ttl=ttl)
        assert await lease.acquire()
        await heartbeat().tick()
        kept.append(lease)  # still referenced, never released: only its loop stops
        await client.close()

    run(hold())
    stopped = time.monotonic()
    assert not lock_client.lease("orphan").acquire()  # not released...
    other = lock_client.lease("orphan")
    assert other.acquire(wait=10)  # ...but no longer renewed
    assert time.monotonic() - stopped < ttl + 0.5
    assert kept[0].lost
    other.release()


def test_an_unreachable_handle_is_no_longer_renewed(lock_redis_url: str, lock_prefix: str) -> None:
    async def body() -> None:
        client = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        lease = client.lease("dropped", ttl=0.6)
        assert await lease.acquire()
        assert len(heartbeat().leases()) == 1
        del lease
        gc.collect()
        assert heartbeat().leases() == []
        started = time.monotonic()
        other = client.lease("dropped")
        assert await other.acquire(wait=5)
        assert time.monotonic() - started < 1.0
        await other.release()
        await client.close()

    run(body())


def test_the_heartbeat_task_ticks_on_its_own_and_ends_when_nothing_is_held(
    lock_redis_url: str, lock_prefix: str
) -> None:
    async def body() -> None:
        client = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        lease = client.lease("beat", ttl=0.3)
        assert await lease.acquire()
        beat = heartbeat()
        ticks = beat.ticks
        await eventually(lambda: beat.ticks >= ticks + 3, 10, "three ticks")
        lease.check()
        task = beat.task
        assert task is not None and not task.done()
        await lease.release()
        await asyncio.wait_for(asyncio.shield(task), 5)  # ends at its next wake-up
        assert beat.task is None
        await client.close()

    run(body())


def test_a_batch_listed_before_a_delayed_release_leaves_the_delay_alone(
    lock_redis_url: str, lock_prefix: str, lock_client: LockClient
) -> None:
    """The interleaving driven step by step: a tick lists the lease, the lease is released
    with a delay, then the tick's batch runs."""

    async def body() -> None:
        client = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        lost: list[Any] = []
        lease = client.lease("delayed", ttl=30, on_lost=lost.append)
        assert await lease.acquire()
        beat = heartbeat()
        listed = beat.leases
        me = asyncio.current_task()
        releases: list[asyncio.Future[None]] = []

        def list_then_release() -> list[Any]:
            leases = listed()
            if asyncio.current_task() is me and not releases:
                assert leases == [lease]
                # Runs before the tick's batch task, which it was started before.
                releases.append(asyncio.ensure_future(lease.release(delay=2)))
            return leases

        beat.leases = list_then_release  # type: ignore[method-assign]
        try:
            await beat.tick()
        finally:
            del beat.leases
        await releases[0]
        key = lease.keys.lock
        assert lock_client.redis.hget(key, "state") == b"release_delay"
        assert 0 < lock_client.redis.pttl(key) <= 2000  # not renewed to the 30 s lease
        assert lost == [] and not lease.lost
        await client.close()

    run(body())
