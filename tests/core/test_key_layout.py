"""Key layout versions (core/layout.py): a connection records its own under a prefix that has
none, and refuses, loudly and naming both versions, a prefix whose keys another release lays
out differently, for every family of keys, before it touches a lock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis

from celery_singleton_lock import AsyncLockClient, KeyLayoutError, LockClient
from celery_singleton_lock.core.layout import LAYOUTS, RECHECK_S, layout_key

#: A first operation on each family's keys, through ``client``; True if it took the lock.
TAKE: dict[str, Callable[[LockClient], bool]] = {
    "lease": lambda c: c.lease("n", ttl=5).acquire(),
    "multi": lambda c: c.multi(["n", "n2"], ttl=5).acquire(),
    "rw": lambda c: c.rwlock("n").read().acquire(),
    "range": lambda c: c.range_lock("n").write(1, 2).acquire(),
    "semaphore": lambda c: c.semaphore("n", 2).permit().acquire(),
}


def take(client: LockClient, kind: str) -> bool:
    """The first operation on ``kind``'s keys; a task's marks are written beside its lease
    (celery/done_marks.py)."""
    if kind == "task_marks":
        from celery_singleton_lock.celery import done_marks

        lease = client.lease("n", ttl=5)
        mark = done_marks.DoneMark.of(client.connection, lease, "t-1", 0, 30.0)
        return done_marks.acquire(client.connection, lease, 0.0, mark)[0]
    return TAKE[kind](client)


def recorded(lock_client: LockClient) -> dict[str, str]:
    raw = lock_client.redis.hgetall(layout_key(lock_client.prefix))
    return {key.decode(): value.decode() for key, value in raw.items()}


def test_every_family_of_keys_has_a_version_and_one_is_taken_for_each_test() -> None:
    assert set(LAYOUTS) == {*TAKE, "task_marks"}
    assert all(isinstance(version, int) and version >= 1 for version in LAYOUTS.values())


def test_the_first_lock_operation_records_the_versions_once(lock_client: LockClient) -> None:
    assert recorded(lock_client) == {}
    assert lock_client.lease("n", ttl=5).acquire()
    assert recorded(lock_client) == {kind: str(version) for kind, version in LAYOUTS.items()}
    # Like every key, the record expires: 30 days after the last check that recorded.
    assert (
        29 * 86_400_000 < lock_client.redis.pttl(layout_key(lock_client.prefix)) <= 30 * 86_400_000
    )
    # Checked once per connection and day: a later acquire does not read them again.
    lock_client.redis.hset(layout_key(lock_client.prefix), "lease", 99)
    assert lock_client.lease("m", ttl=5).acquire()


def test_a_connection_checks_again_a_day_later_and_keeps_the_record_alive(
    lock_client: LockClient,
) -> None:
    """A long-lived process (a worker running for weeks) checks the versions again on its
    first lock operation a day after the last check: that refreshes the record's 30 days,
    and finds a prefix another release took over meanwhile."""
    key = layout_key(lock_client.prefix)
    assert lock_client.lease("n", ttl=5).acquire()
    lock_client.redis.pexpire(key, 60_000)  # as if most of its 30 days had passed
    assert lock_client.lease("m", ttl=5).acquire()
    assert lock_client.redis.pttl(key) <= 60_000  # not the day yet: not read again
    connection = lock_client.connection
    assert connection.layout_checked_at is not None
    connection.layout_checked_at -= RECHECK_S  # a day later
    assert lock_client.lease("o", ttl=5).acquire()
    assert lock_client.redis.pttl(key) > 29 * 86_400_000
    lock_client.redis.hset(key, "lease", 99)
    connection.layout_checked_at -= RECHECK_S
    with pytest.raises(KeyLayoutError, match="version 99"):
        lock_client.lease("p", ttl=5).acquire()


@pytest.mark.parametrize("first", ["wait mark", "done mark"])
def test_the_task_layers_own_marks_check_the_layout_as_a_first_operation(
    lock_redis_url: str, lock_prefix: str, first: str
) -> None:
    """A wait mark's claim and a done mark's record can be a connection's first write under
    a prefix: they check the versions first, as a lock operation does."""
    from celery_singleton_lock.celery import done_marks, waiting_marks

    seeded = redis.Redis.from_url(lock_redis_url)
    seeded.hset(layout_key(lock_prefix), "task_marks", LAYOUTS["task_marks"] + 1)
    client = LockClient.from_url(lock_redis_url, prefix=lock_prefix)
    connection = client.connection
    try:
        with pytest.raises(KeyLayoutError, match="task_marks"):
            if first == "wait mark":
                key = done_marks.key_beside(connection, client.lease("n"), "waiting", "t-1", 0)
                waiting_marks.claim(
                    connection, key, wait=5.0, node=None, requeues=0, max_countdown=None
                )
            else:
                mark = done_marks.DoneMark.of(connection, client.lease("n"), "t-1", 0, 30.0)
                done_marks.read_ended(connection, mark)
        assert seeded.keys(f"{lock_prefix}*") == [layout_key(lock_prefix)]
    finally:
        client.close()
        seeded.delete(layout_key(lock_prefix))
        seeded.close()


@pytest.mark.parametrize("kind", sorted(LAYOUTS))
def test_a_family_laid_out_by_another_release_is_refused_naming_both_versions(
    lock_redis_url: str, lock_prefix: str, kind: str
) -> None:
    other = LAYOUTS[kind] + 1
    seeded = redis.Redis.from_url(lock_redis_url)
    try:
        seeded.hset(layout_key(lock_prefix), kind, other)
        client = LockClient.from_url(lock_redis_url, prefix=lock_prefix)
        try:
            for _ in range(2):  # and again: a refusal is not remembered as checked
                with pytest.raises(KeyLayoutError) as refused:
                    take(client, kind)
                message = str(refused.value)
                assert f"the {kind} keys under prefix {lock_prefix!r}" in message
                assert f"version {other};" in message
                assert f"writes version {LAYOUTS[kind]}" in message
                assert (refused.value.kind, refused.value.found) == (kind, str(other))
                assert refused.value.expected == str(LAYOUTS[kind])
            # Nothing was written but the versions the prefix lacked.
            assert seeded.keys(f"{lock_prefix}*") == [layout_key(lock_prefix)]
            assert seeded.hget(layout_key(lock_prefix), kind) == str(other).encode()
            # Once the prefix's versions are this release's, the same connection goes on.
            seeded.hset(layout_key(lock_prefix), kind, LAYOUTS[kind])
            assert take(client, kind)
        finally:
            client.close()
    finally:
        seeded.delete(layout_key(lock_prefix))
        seeded.close()


def test_the_admin_calls_refuse_it_too(lock_redis_url: str, lock_prefix: str) -> None:
    client = LockClient.from_url(lock_redis_url, prefix=lock_prefix)
    try:
        client.redis.hset(layout_key(lock_prefix), "range", LAYOUTS["range"] + 1)
        calls: list[Callable[[], object]] = [
            client.locks,
            lambda: client.clear("n", force=True),
            lambda: client.release_owner("n", "claim:x:0"),
            lambda: client.release_holder("n", task_id="t", pid=1),
            lambda: client.rwlock("n").read().release_holder(task_id="t", pid=1),
            lambda: client.range_lock("n").write(1, 2).release_holder(task_id="t", pid=1),
            lambda: client.semaphore("n", 2).permit().release_holder(task_id="t", pid=1),
            lambda: client.multi(["n", "n2"]).release_holder(task_id="t", pid=1),
        ]
        for call in calls:
            with pytest.raises(KeyLayoutError, match="the range keys"):
                call()
    finally:
        client.close()


def test_a_listing_reads_the_versions_and_records_none(lock_client: LockClient) -> None:
    assert lock_client.locks() == []
    assert recorded(lock_client) == {}
    assert lock_client.lease("n", ttl=5).acquire()  # what takes a lock records them
    assert set(recorded(lock_client)) == set(LAYOUTS)


def test_a_family_only_another_release_knows_is_not_refused(lock_client: LockClient) -> None:
    lock_client.redis.hset(layout_key(lock_client.prefix), "queues", 7)
    assert lock_client.lease("n", ttl=5).acquire()


def test_the_asyncio_client_refuses_the_same(lock_redis_url: str, lock_prefix: str) -> None:
    async def body() -> None:
        client = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        try:
            await client.redis.hset(layout_key(lock_prefix), "rw", LAYOUTS["rw"] + 1)
            with pytest.raises(KeyLayoutError, match=r"the rw keys .* have key layout version"):
                await client.rwlock("n").write().acquire()
            with pytest.raises(KeyLayoutError):
                await client.lease("n", ttl=5).acquire()
            await client.redis.hset(layout_key(lock_prefix), "rw", LAYOUTS["rw"])
            lease: Any = client.lease("n", ttl=5)
            assert await lease.acquire()
            await lease.release()
        finally:
            await client.close()

    asyncio.run(body())
