"""The two runners of a handle's operations (core/steps.py): one generator, run by the
sync handle with threads and by the asyncio handle awaited, meets the same Redis the same
way. An error doing a step is thrown into the operation, which handles it and goes on;
its ``finally`` runs; the channels it listened to are left when it ends."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from support.async_sides import run
from support.waiting import wait_for

from celery_singleton_lock import AsyncLockClient, LockBackendError, LockClient
from celery_singleton_lock.core.replies import Reply
from celery_singleton_lock.core.scripts import ScriptCall, register
from celery_singleton_lock.core.steps import Listen, Pause, Steps

FAILING = "return redis.error_reply('refused on purpose')"
PAUSE = 0.05


def operation(
    handle: Any, scripts: Any, failing: ScriptCall, listeners: Callable[[], int], seen: list[str]
) -> Steps[int]:
    """Listen, meet an error, pause, then release a name nobody holds: its reply
    (``scripts``: the script builders of the handle's client's connection)."""
    yield Listen((handle.keys.channel,))
    seen.append(f"listeners {listeners()}")
    try:
        yield failing
    except LockBackendError as error:
        seen.append(f"caught: {error}")
    started = time.monotonic()
    yield Pause(PAUSE)
    seen.append(f"paused {time.monotonic() - started >= PAUSE}")
    try:
        return int((yield scripts.release_call(handle.keys.lock, "nobody", 0)))
    finally:
        seen.append("finally")


def subscribers(client: LockClient, channel: bytes) -> int:
    return int(dict(client.redis.pubsub_numsub(channel)).get(channel, 0))


def check(seen: list[str], reply: int) -> None:
    assert reply == Reply.GONE
    assert len(seen) == 4
    assert seen[0] == "listeners 1"
    assert seen[1].startswith("caught: ") and "refused on purpose" in seen[1]
    assert seen[2:] == ["paused True", "finally"]


def left(client: LockClient, channel: bytes) -> None:
    """Until nobody listens on ``channel`` (the sync listener unsubscribes on its thread)."""
    wait_for(lambda: subscribers(client, channel) == 0, 10, "the operation to stop listening")


@pytest.mark.timeout(30)
def test_the_sync_runner_throws_a_steps_error_into_the_operation(
    lock_client: LockClient,
) -> None:
    lease = lock_client.lease("steps")
    channel = lease.keys.channel
    failing = (register(lock_client.redis, FAILING), (lease.keys.lock,), ())
    seen: list[str] = []
    listeners = partial(subscribers, lock_client, channel)
    scripts = lock_client.connection.scripts
    check(seen, lease._run(operation(lease, scripts, failing, listeners, seen)))
    left(lock_client, channel)


@pytest.mark.timeout(30)
def test_the_asyncio_runner_throws_a_steps_error_into_the_operation(
    lock_client: LockClient, lock_redis_url: str
) -> None:
    channel = lock_client.lease("steps").keys.channel

    async def body() -> None:
        client = AsyncLockClient.from_url(lock_redis_url, prefix=lock_client.prefix)
        try:
            lease = client.lease("steps")
            failing = (register(client.redis, FAILING), (lease.keys.lock,), ())
            seen: list[str] = []
            listeners = partial(subscribers, lock_client, channel)
            steps = operation(lease, client.connection.scripts, failing, listeners, seen)
            check(seen, await lease._run(steps))
        finally:
            await client.close()

    run(body())
    left(lock_client, channel)
