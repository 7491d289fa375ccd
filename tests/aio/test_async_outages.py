"""The asyncio client while its Redis is down, and after it comes back empty."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from typing import Any

import pytest
import redis
from support.async_sides import eventually, run

from celery_singleton_lock import AsyncLockClient, LockBackendError, LockExpired
from celery_singleton_lock.embedded import RedisServer

PASSWORD = "s3cret-" + uuid.uuid4().hex[:8]


@pytest.mark.timeout(60)
def test_calls_while_redis_is_down_raise_backend_error_naming_the_server_only() -> None:
    with RedisServer(password=PASSWORD) as server:

        async def body() -> None:
            client = AsyncLockClient.from_url(server.url, prefix="pw:")
            held = client.lease("held", ttl=30)
            assert await held.acquire()
            server.stop()
            held.check()  # no round trip: still fine, the lease has not run out
            for call in (client.lease("other").acquire, held.release, client.ping, client.locks):
                with pytest.raises(LockBackendError) as info:
                    await call()
                assert f"127.0.0.1:{server.port}" in str(info.value)
                assert PASSWORD not in str(info.value) and PASSWORD not in repr(client)
            await client.close()

        run(body())


@pytest.mark.timeout(60)
def test_a_blocked_waiter_rides_out_a_restart_and_the_client_recovers(
    restartable_redis: RedisServer,
) -> None:
    probe = redis.Redis(port=restartable_redis.port)

    async def body() -> None:
        client = AsyncLockClient.from_url(restartable_redis.url, prefix="down:")
        holder = client.lease("busy", ttl=30)
        assert await holder.acquire()
        waiter = client.lease("busy")
        waiting = asyncio.ensure_future(waiter.acquire(wait=60))
        channel = holder.keys.channel

        def subscribed() -> bool:
            return dict(probe.pubsub_numsub(channel)).get(channel, 0) >= 1

        await eventually(lambda: asyncio.to_thread(subscribed), 10, "the waiter to subscribe")
        restartable_redis.stop()
        restartable_redis.start()
        # The listener's lost connection wakes the waiter, whose next try meets the dead
        # connection: it keeps trying within its 60 s, and the restarted (empty) server has
        # the name free.
        assert await asyncio.wait_for(waiting, 20) is True
        await waiter.release()
        # A waiter whose wait runs out while Redis is down says Redis did not answer.
        other = client.lease("other", ttl=30)
        assert await other.acquire()
        late = asyncio.ensure_future(client.lease("other").acquire(wait=1.5))
        other_channel = other.keys.channel

        def other_subscribed() -> bool:
            return dict(probe.pubsub_numsub(other_channel)).get(other_channel, 0) >= 1

        await eventually(lambda: asyncio.to_thread(other_subscribed), 10, "the late waiter")
        restartable_redis.stop()
        with pytest.raises(LockBackendError):
            await asyncio.wait_for(late, 20)
        restartable_redis.start()
        # Nothing to restart: the next call connects to the new (empty) server.
        again = client.lease("busy")
        assert await again.acquire(wait=5)
        await again.release()
        await client.close()

    try:
        run(body())
    finally:
        probe.close()


@pytest.mark.timeout(60)
def test_a_frozen_server_does_not_cost_the_leases_on_another(
    lock_redis_url: str, lock_prefix: str, restartable_redis: RedisServer
) -> None:
    ttl = 0.9
    assert restartable_redis.process is not None
    pid = restartable_redis.process.pid

    async def body() -> None:
        healthy = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        # Its calls hang for longer than a whole lease on the healthy server lasts.
        frozen = AsyncLockClient.from_url(
            restartable_redis.url, prefix="frozen:", socket_timeout=1.5
        )
        in_flight, most = 0, 0
        call = frozen.connection.call

        async def counted(*args: Any) -> Any:
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            try:
                return await call(*args)
            finally:
                in_flight -= 1

        frozen.connection.call = counted  # type: ignore[method-assign]
        b_lost = asyncio.Event()
        lease_a = healthy.lease("healthy", ttl=ttl)
        lease_b = frozen.lease("frozen", ttl=ttl, on_lost=lambda _: b_lost.set())
        assert await lease_a.acquire() and await lease_b.acquire()
        os.kill(pid, signal.SIGSTOP)
        try:
            stopped_at = time.monotonic()
            # Time passing is what is tested: four ttls of the healthy lease, each renewal
            # of it due while the frozen server's calls hang.
            while time.monotonic() - stopped_at < 4 * ttl:
                lease_a.check()
                await asyncio.sleep(0.05)
            await asyncio.wait_for(b_lost.wait(), 20)
            with pytest.raises(LockExpired) as info:
                lease_b.check()
            assert info.value.reason == "unreachable"
            lease_a.check()
            assert lease_a.held
        finally:
            os.kill(pid, signal.SIGCONT)
        # The heartbeat skipped the frozen client while its batch hung, not piled more on.
        assert most == 1, f"{most} renewals of the frozen server were in flight at once"
        await lease_a.release()
        await healthy.close()
        await frozen.close()

    run(body())
