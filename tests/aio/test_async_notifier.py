"""The asyncio waiters' wake-up path: what a waiter sleeps on, and a channel's subscription
after its last waiter left (its UNSUBSCRIBE is sent by a task of the notifier, later)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from support.async_sides import eventually, run

from celery_singleton_lock import AsyncLockClient, LockClient
from celery_singleton_lock.aio.notifier import AsyncNotifier, Wakeup


def test_a_wakeup_set_while_nobody_sleeps_is_kept_for_the_next_sleep() -> None:
    async def body() -> None:
        wakeup = Wakeup()
        wakeup.set()  # a message that came during the waiter's attempt
        started = time.monotonic()
        await wakeup.wait(5)
        assert time.monotonic() - started < 1  # kept, not lost
        started = time.monotonic()
        await wakeup.wait(0.2)  # cleared by the wait that saw it: this one sleeps
        assert time.monotonic() - started >= 0.19
        asyncio.get_running_loop().call_later(0.05, wakeup.set)
        started = time.monotonic()
        await wakeup.wait(5)
        assert time.monotonic() - started < 1

    run(body())


def test_a_cancelled_sleep_leaves_the_wakeup_usable() -> None:
    async def body() -> None:
        wakeup = Wakeup()
        sleeper = asyncio.ensure_future(wakeup.wait(30))
        await asyncio.sleep(0.01)
        sleeper.cancel()
        await asyncio.gather(sleeper, return_exceptions=True)
        assert sleeper.cancelled()
        wakeup.set()  # no future left to complete: must not raise
        await asyncio.wait_for(wakeup.wait(5), 1)

    run(body())


def numsub(lock_client: LockClient, channel: bytes) -> int:
    return int(dict(lock_client.redis.pubsub_numsub(channel)).get(channel, 0))


@asynccontextmanager
async def notifier_of(url: str, prefix: str) -> AsyncIterator[tuple[AsyncNotifier, bytes]]:
    """The listener of a new client on this loop, and the channel of lock "n"."""
    client = AsyncLockClient.from_url(url, prefix=prefix)
    try:
        yield client.connection.notifier(), client.connection.keys("n").channel
    finally:
        await client.close()


def test_last_waiter_leaving_unsubscribes_after_it_returned(
    lock_redis_url: str, lock_prefix: str, lock_client: LockClient
) -> None:
    async def body() -> None:
        async with notifier_of(lock_redis_url, lock_prefix) as (notifier, channel):
            async with notifier.listening([channel]):
                assert await asyncio.to_thread(numsub, lock_client, channel) == 1
            # Left, and nothing has been sent yet: the waiter did not wait for UNSUBSCRIBE.
            assert notifier.listens_to(channel)
            assert notifier.subscriptions.waiters(channel) == 0
            await eventually(
                lambda: asyncio.to_thread(lambda: numsub(lock_client, channel) == 0),
                10,
                "the channel to be unsubscribed",
            )
            assert not notifier.listens_to(channel)

    run(body())


def test_a_waiter_back_on_a_channel_before_its_unsubscribe_keeps_it_and_is_woken(
    lock_redis_url: str, lock_prefix: str, lock_client: LockClient
) -> None:
    """The interleaving: the last waiter leaves (the UNSUBSCRIBE is not sent yet) and a new
    waiter enters the same channel before the unsubscriber task runs. It must find the
    subscription live, and the unsubscriber must leave it so."""

    async def body() -> None:
        async with notifier_of(lock_redis_url, lock_prefix) as (notifier, channel):
            async with notifier.listening([channel]):
                pass
            # No await between the leaving and the coming back: the unsubscriber waits.
            async with notifier.listening([channel]) as wakeup:
                for _ in range(5):
                    await asyncio.sleep(0)  # the unsubscriber runs now
                assert notifier.subscriptions.waiters(channel) == 1
                assert notifier.listens_to(channel)  # the unsubscriber left it subscribed
                assert await asyncio.to_thread(numsub, lock_client, channel) == 1
                await asyncio.to_thread(lock_client.redis.publish, channel, b"released")
                started = time.monotonic()
                await wakeup.wait(5)
                assert time.monotonic() - started < 2  # woken by the message, not timed out

    run(body())
