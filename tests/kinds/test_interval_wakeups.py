"""Waking waiters of reader-writer and range locks: a release publishes only when a waiter
marked the lock (its ``B waiting`` key), and every way a hold goes still reaches a waiter.

The mark-and-publish steps are driven through the scripts one at a time (no racing threads)
with a real pub/sub subscriber counting what they published; the wake-ups are timed on real
blocked acquires whose wait hint is long (a 30 s hold), so a wake-up within a second can
only come from a publish.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.attempts import change, try_acquire
from support.pubsub import Channel
from support.waiting import BackgroundAcquire

from celery_singleton_lock import LockClient
from celery_singleton_lock.core.replies import Reply
from celery_singleton_lock.kinds import rwlock
from celery_singleton_lock.kinds.rwlock import RWLockHandle, release_hold

#: A wake-up by a publish arrives well within this; the hint of a 30 s hold is 30 s.
PROMPT = 1.0


@pytest.fixture
def channel(lock_client: LockClient) -> Iterator[Channel]:
    subscriber = Channel(lock_client, lock_client.rwlock("wake").read().keys.channel)
    yield subscriber
    subscriber.close()


def hold(client: LockClient, mode: str, ttl: float = 30) -> RWLockHandle:
    handle = getattr(client.rwlock("wake"), mode)(ttl=ttl, heartbeat=False)
    assert handle.acquire()
    return handle


def waiting_reader(client: LockClient) -> tuple[RWLockHandle, BackgroundAcquire]:
    """A reader blocked in acquire, returned once it made its failed attempt after its
    subscription was live (its second: the first comes before it subscribes), so it now
    sleeps until a publish or its hint."""
    reader = client.rwlock("wake").read(heartbeat=False)
    attempts = threading.Semaphore(0)
    attempt = reader._try_acquire

    def counted(owner: str, reserve: bool) -> Any:
        try:
            return (yield from attempt(owner, reserve))
        finally:
            attempts.release()

    reader._try_acquire = counted  # type: ignore[method-assign]
    blocked = BackgroundAcquire(reader, wait=25)
    assert attempts.acquire(timeout=10) and attempts.acquire(timeout=10)
    assert not blocked.done.is_set()
    return reader, blocked


def marked(client: LockClient) -> bool:
    return bool(client.redis.exists(client.rwlock("wake").read().keys.waiting))


def release(client: LockClient, owner: str, delay_ms: int = 0) -> int:
    handle = client.rwlock("wake").read()
    return release_hold(client.connection, handle.keys, owner, delay_ms)


def test_uncontended_releases_publish_nothing(lock_client: LockClient, channel: Channel) -> None:
    rw = lock_client.rwlock("wake")
    for make in (rw.read, rw.upgradable, rw.write, rw.read):
        handle = make(heartbeat=False)
        assert handle.acquire()
        handle.release()
    readers = [rw.read(heartbeat=False) for _ in range(3)]
    assert all(reader.acquire() for reader in readers)
    for reader in readers:
        reader.release()
    assert not marked(lock_client)
    assert channel.published() == []


def test_failed_attempt_of_a_waiter_marks_and_the_release_publishes_once(
    lock_client: LockClient, channel: Channel
) -> None:
    writer = hold(lock_client, "write")
    taken, hint = try_acquire(lock_client.rwlock("wake").read(), "reader", True)
    assert not taken and 0 < hint <= 30_000
    assert marked(lock_client)
    # The mark outlives the hint: the waiter sleeps that long before it looks again.
    assert lock_client.redis.pttl(writer.keys.waiting) > hint
    writer.release()
    assert not marked(lock_client)  # taken by the release that published
    assert channel.published() == [b"released"]
    again = hold(lock_client, "write")
    again.release()  # nobody marked since
    assert channel.published() == []


def test_failed_try_without_wait_does_not_mark(lock_client: LockClient, channel: Channel) -> None:
    writer = hold(lock_client, "write")
    assert not try_acquire(lock_client.rwlock("wake").read(), "reader", False)[0]
    assert not lock_client.rwlock("wake").write().acquire(wait=0)
    assert not marked(lock_client)
    writer.release()
    assert channel.published() == []


def test_a_shorter_hint_never_shortens_the_mark(lock_client: LockClient) -> None:
    writer = hold(lock_client, "write")
    rw = lock_client.rwlock("wake")
    assert not try_acquire(rw.read(), "long", True)[0]  # hint: the writer's 30 s
    writer.release()
    reader = hold(lock_client, "read")
    # A queued writer blocked by the reader, then a reader blocked by its 1.5 s reservation.
    assert not try_acquire(rw.write(), "queued", True)[0]
    taken, hint = try_acquire(rw.read(), "short", True)
    assert not taken and hint <= 1_500
    assert lock_client.redis.pttl(reader.keys.waiting) > 1_500 + 1_000
    assert release(lock_client, "queued") == Reply.DONE
    reader.release()


def test_blocked_reader_is_woken_by_the_writers_release(lock_client: LockClient) -> None:
    writer = hold(lock_client, "write")
    reader, blocked = waiting_reader(lock_client)
    assert marked(lock_client)
    released = time.monotonic()
    writer.release()
    blocked.finish(PROMPT)
    assert blocked.results == [True] and time.monotonic() - released < PROMPT
    reader.release()


def test_blocked_upgrade_is_woken_by_the_last_readers_release(
    lock_client: LockClient, channel: Channel
) -> None:
    up = hold(lock_client, "upgradable")
    reader = hold(lock_client, "read")
    code, hint = change(up, "upgrade", reserve=1_500)
    assert code == Reply.BUSY and hint > 0
    assert marked(lock_client)
    reader.release()
    assert channel.published() == [b"released"]
    code, _ = change(up, "upgrade", reserve=1_500)
    assert code == Reply.DONE
    up.release()


def test_clear_by_the_admin_wakes_a_waiter(lock_client: LockClient) -> None:
    writer = hold(lock_client, "write")
    reader, blocked = waiting_reader(lock_client)
    assert rwlock.clear_holder(lock_client, "wake", writer.owner or "", token=writer.token)
    blocked.finish(PROMPT)
    assert blocked.results == [True]
    reader.release()


def test_waiter_whose_mark_is_gone_still_gets_in_at_its_hint(lock_client: LockClient) -> None:
    writer = hold(lock_client, "write", ttl=3)  # the reader's hint: at most 3 s
    reader, blocked = waiting_reader(lock_client)
    lock_client.redis.delete(writer.keys.waiting)  # as if it ran out
    writer.release()  # publishes nothing: nobody marked the lock now
    assert not blocked.done.wait(0.3)
    blocked.finish(5)
    assert blocked.results == [True]
    reader.release()


def test_release_with_a_delay_publishes_nothing_and_keeps_the_mark(
    lock_client: LockClient, channel: Channel
) -> None:
    writer = hold(lock_client, "write")
    owner = writer.owner or ""
    assert not try_acquire(lock_client.rwlock("wake").read(), "reader", True)[0]
    assert release(lock_client, owner, delay_ms=5_000) == Reply.DONE
    taken, hint = try_acquire(lock_client.rwlock("wake").read(), "reader", True)
    assert not taken and 0 < hint <= 5_000  # the waiter sleeps until the delay ends
    assert marked(lock_client)
    assert channel.published() == []
    assert release(lock_client, owner) == Reply.DONE  # ended early (as the admin's clear does)
    assert channel.published() == [b"released"]


def test_given_up_writer_wakes_the_readers_its_reservation_held_back(
    lock_client: LockClient, channel: Channel
) -> None:
    reader = hold(lock_client, "read")
    rw = lock_client.rwlock("wake")
    assert not try_acquire(rw.write(), "writer", True)[0]
    assert not try_acquire(rw.read(), "late", True)[0]  # held back by the reservation
    assert release(lock_client, "writer") == Reply.DONE  # the writer's abandon
    assert channel.published() == [b"released"]
    assert try_acquire(rw.read(), "late", True)[0]
    reader.release()
