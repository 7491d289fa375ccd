"""The asyncio client from a ``sentinel://`` URL (as the sync client reads it) on a real master,
replica and sentinel: it excludes the sync client's locks, follows a failover, and names the
servers without a password; and ``AsyncLockClient.release_holder`` for a supervisor."""

from __future__ import annotations

import asyncio
import os

import pytest
from support.redis_topologies import SENTINEL_MASTER, SentinelSet
from test_sentinel import FAILOVER_TIMEOUT, fail_over

from celery_singleton_lock import AsyncLockClient, ConfigurationError, LockClient
from celery_singleton_lock.embedded import free_port
from celery_singleton_lock.exceptions import LockBackendError


def test_a_sentinel_url_gives_a_client_that_follows_a_failover(
    sentinels: SentinelSet, prefix: str
) -> None:
    sync = LockClient.from_url(sentinels.url, prefix=prefix)

    async def before_failover() -> int:
        client = AsyncLockClient.from_url(sentinels.url, prefix=prefix)
        try:
            assert (
                client.url == f"sentinel://127.0.0.1:{sentinels.sentinel.port}/{SENTINEL_MASTER}/0"
            )
            async with client.lease("shared", ttl=10) as lease:
                assert lease.token is not None
                assert not sync.lease("shared").acquire()  # one lock, both clients
                # The replica has it before the master dies.
                assert await client.redis.execute_command("WAIT", 1, 5000) == 1
                return lease.token
        finally:
            await client.close()

    async def acquire_after_failover(client: AsyncLockClient) -> int | None:
        lease = client.lease("shared", ttl=10)
        try:
            if not await lease.acquire():
                return None
        except LockBackendError:
            return None  # still finding the new master
        await lease.release()
        return lease.token

    try:
        before = asyncio.run(before_failover())
        fail_over(sentinels)

        async def after() -> int:
            client = AsyncLockClient.from_url(sentinels.url, prefix=prefix)
            try:
                deadline = asyncio.get_running_loop().time() + FAILOVER_TIMEOUT
                while (token := await acquire_after_failover(client)) is None:
                    assert asyncio.get_running_loop().time() < deadline
                    await asyncio.sleep(0.1)
                return token
            finally:
                await client.close()

        # The fencing counter was replicated: the new master's tokens are larger.
        assert asyncio.run(after()) > before
    finally:
        sync.close()


def test_a_sentinel_password_stays_out_of_the_url(sentinels: SentinelSet, prefix: str) -> None:
    url = sentinels.url.replace("sentinel://", "sentinel://:hunter2@")
    client = AsyncLockClient.from_url(url, prefix=prefix)
    assert "hunter2" not in client.url and "hunter2" not in repr(client)


def test_release_holder_frees_a_dead_childs_lease(lock_redis_url: str, lock_prefix: str) -> None:
    sync = LockClient.from_url(lock_redis_url, prefix=lock_prefix)
    held = sync.lease("child-held", ttl=30, owner_info={"task_id": "t-1"})
    assert held.acquire()

    async def supervise() -> tuple[bool, bool, bool]:
        client = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        try:
            wrong_task = await client.release_holder("child-held", task_id="t-2", pid=os.getpid())
            wrong_pid = await client.release_holder("child-held", task_id="t-1", pid=1)
            right = await client.release_holder(
                "child-held", task_id="t-1", pid=os.getpid(), delay=20
            )
            return wrong_task, wrong_pid, right
        finally:
            await client.close()

    try:
        assert asyncio.run(supervise()) == (False, False, True)
        [record] = sync.holders("child-held")  # the release delay is what is left
        assert record.owner is None or record.owner == ""
        assert not sync.lease("child-held").acquire()
    finally:
        sync.close()


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"task_id": "", "pid": 1}, "task_id"),
        ({"task_id": "t", "pid": -1}, "pid"),
        ({"task_id": "t", "pid": 1, "delay": -1}, "delay"),
        ({"task_id": "t", "pid": 1, "host": ""}, "host"),
    ],
)
def test_release_holder_refuses_bad_arguments_before_any_redis_call(
    arguments: dict[str, object], named: str
) -> None:
    async def call() -> None:
        client = AsyncLockClient.from_url(f"redis://127.0.0.1:{free_port()}/0")
        try:
            await client.release_holder("x", **arguments)  # type: ignore[arg-type]
        finally:
            await client.close()

    with pytest.raises(ConfigurationError) as info:
        asyncio.run(call())
    assert info.value.argument == named
