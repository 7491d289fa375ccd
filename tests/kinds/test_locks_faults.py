"""Reader-writer, range and multi-key locks under the faults the exclusive lease is tested
with (test_lease_processes.py, test_lease_outages.py): a holder SIGKILLed, a holder paused
(SIGSTOP) past its lease and then resumed, and Redis stopped and started again empty.

Each test runs over five kinds of hold: a reader-writer read and write, a range write on
[0, 10], a multi-key lock on two names and a permit of a semaphore of one permit. The
conflicting hold taken by the test (the "rival") is of the same lock: a writer for the
reader, a reader for the writer, a write on [5, 15] for the range, for the multi-key lock a
multi-key lock sharing one of its names, and another permit for the semaphore.
After every scenario each Redis key the locks left behind must have an expiry.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from support.kind_children import holder_process, make_handle, multi_names
from support.waiting import BackgroundAcquire, wait_for_subscriber

from celery_singleton_lock import LockBackendError, LockClient, LockExpired, LockLost, MultiLease
from celery_singleton_lock.embedded import RedisServer
from celery_singleton_lock.kinds import multi, rangelock, rwlock, semaphore

KINDS = ["rw-read", "rw-write", "range-write", "multi", "semaphore"]

#: A hold that conflicts with the kind's hold on the same lock name.
RIVALS: dict[str, Callable[..., Any]] = {
    "rw-read": lambda client, name, **options: client.rwlock(name).write(**options),
    "rw-write": lambda client, name, **options: client.rwlock(name).read(**options),
    "range-write": lambda client, name, **options: client.range_lock(name).write(5, 15, **options),
    "multi": lambda client, name, **options: client.multi(
        [multi_names(name)[1], f"{name}-c"], **options
    ),
    "semaphore": lambda client, name, **options: client.semaphore(name, 1).permit(**options),
}

#: The listing of live holders of each family of lock.
LISTINGS: dict[str, Callable[[LockClient], list[dict[str, Any]]]] = {
    "rw": rwlock.list_holders,
    "range": rangelock.list_holders,
    "multi": multi.list_holders,
    "semaphore": semaphore.list_holders,
}

Hold = list[tuple[str, str, int]]


def holders(client: LockClient, kind: str) -> Hold:
    """(name, owner, fencing token) of every live hold of ``kind``'s family in Redis."""
    listing = LISTINGS[kind.split("-")[0]]
    return sorted((h["name"], h["owner"], h["token"]) for h in listing(client))


def tokens_of(handle: Any) -> dict[str, int]:
    """The fencing token of each name ``handle`` holds."""
    if isinstance(handle, MultiLease):
        return handle.tokens
    return {handle.name: handle.token}


def hold_of(handle: Any) -> Hold:
    """What :func:`holders` lists for ``handle`` alone."""
    return sorted((name, handle.owner, token) for name, token in tokens_of(handle).items())


def assert_every_key_expires(client: LockClient) -> None:
    """Every key of a lock under the client's prefix has an expiry: nothing a lock wrote,
    whatever happened to its holders, stays in Redis for ever (the prefix's key layout record,
    outside every lock's hash tag, is meant to)."""
    keys = list(client.redis.scan_iter(match=client.prefix + "{*"))
    assert keys, "no key at all: the check would prove nothing"  # the fencing counter stays
    forever = [key for key in keys if client.redis.pttl(key) == -1]
    assert not forever, forever


def assert_newer(rival: Any, old_tokens: dict[str, int]) -> None:
    """The rival's fencing tokens are larger than the old holder's, overall and on every
    name both hold."""
    new_tokens = tokens_of(rival)
    assert rival.token > max(old_tokens.values())
    shared = set(new_tokens) & set(old_tokens)
    assert shared, (new_tokens, old_tokens)
    for name in shared:
        assert new_tokens[name] > old_tokens[name], name


@contextmanager
def paused(pid: int) -> Iterator[None]:
    """SIGSTOP ``pid`` for the block; it is resumed whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.fixture
def restartable_client(restartable_redis: RedisServer, lock_prefix: str) -> Iterator[LockClient]:
    client = LockClient.from_url(restartable_redis.url, prefix=lock_prefix)
    yield client
    client.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", KINDS)
def test_sigkilled_holder_is_freed_within_its_ttl_and_fenced_off(
    kind: str, lock_client: LockClient, lock_redis_url: str
) -> None:
    ttl = 1.0
    with holder_process(lock_redis_url, lock_client.prefix, kind, "crash", ttl) as holder:
        expected = sorted((name, holder.owner, t) for name, t in holder.tokens.items())
        assert holders(lock_client, kind) == expected
        rival = RIVALS[kind](lock_client, "crash")
        # Alive, its heartbeat keeps the hold past its ttl.
        assert not rival.acquire(wait=ttl + 0.5)
        os.kill(holder.pid, signal.SIGKILL)
        killed = time.monotonic()
        # Nobody releases: the rival is woken by its hint at the dead hold's expiry.
        assert rival.acquire(wait=ttl + 5)
        assert time.monotonic() - killed < ttl + 0.5
        holder.process.join(5)
        assert holder.process.exitcode == -signal.SIGKILL
    assert_newer(rival, holder.tokens)
    assert holders(lock_client, kind) == hold_of(rival)
    assert_every_key_expires(lock_client)
    rival.release()
    assert holders(lock_client, kind) == []
    assert_every_key_expires(lock_client)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", KINDS)
def test_paused_holder_finds_its_hold_lost_and_leaves_the_new_holder_alone(
    kind: str, lock_client: LockClient, lock_redis_url: str
) -> None:
    ttl = 1.0
    with holder_process(lock_redis_url, lock_client.prefix, kind, "paused", ttl) as holder:
        rival = RIVALS[kind](lock_client, "paused")
        assert not rival.acquire()
        with paused(holder.pid):
            stopped = time.monotonic()
            assert rival.acquire(wait=ttl + 5)
            assert time.monotonic() - stopped < ttl + 0.5

        # Resumed: the holder finds its hold lost, by itself and by its heartbeat...
        report = holder.ask("check")
        assert report["held"] is False
        assert report["lost"] is True
        assert report["lock_lost"] is True, report
        assert report["error"] in ("LockExpired", "LockTaken"), report
        assert report["renewed"] is False  # the heartbeat gave it up
        assert report["on_lost"] == 1
        released = holder.ask("release")
        assert released["lock_lost"] is True, released
        assert released["error"] in ("LockExpired", "LockTaken"), released

        # ...and whatever its heartbeat and its release did, the rival's hold is intact.
        assert holders(lock_client, kind) == hold_of(rival)
        assert rival.held
        rival.check()
        assert_newer(rival, holder.tokens)
        assert_every_key_expires(lock_client)
        rival.release()
        assert holders(lock_client, kind) == []
        assert_every_key_expires(lock_client)
        assert holder.ask("exit") == "bye"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", KINDS)
def test_redis_restarted_empty_is_detected_at_the_next_tick(
    kind: str, restartable_client: LockClient, restartable_redis: RedisServer
) -> None:
    client = restartable_client
    ttl = 3.0
    lost = threading.Event()
    handle = make_handle(client, kind, "blip", ttl=ttl, on_lost=lambda _: lost.set())
    assert handle.acquire()
    acquired_at = time.monotonic()
    before = tokens_of(handle)
    restartable_redis.stop()
    restartable_redis.start()  # back, but empty: the hold is gone
    assert lost.wait(ttl + 5)
    # Found by a renewal (the tick period is ttl / 3), not by the hold running out locally.
    assert time.monotonic() - acquired_at < ttl
    assert handle.lost and not handle.held
    with pytest.raises(LockExpired) as info:
        handle.check()
    assert info.value.reason == "expired"
    with pytest.raises(LockLost):
        handle.release()

    # The lock is free again, and fencing tokens still increase although the counter was
    # lost with the rest of Redis: they are seeded from the server clock.
    fresh = make_handle(client, kind, "blip", ttl=ttl)
    assert fresh.acquire()
    assert_newer(fresh, before)
    assert holders(client, kind) == hold_of(fresh)
    assert_every_key_expires(client)
    fresh.release()
    assert holders(client, kind) == []
    assert_every_key_expires(client)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", KINDS)
def test_acquire_while_redis_is_down_raises_backend_error(
    kind: str, restartable_client: LockClient, restartable_redis: RedisServer
) -> None:
    client = restartable_client
    holder = make_handle(client, kind, "down", ttl=30, heartbeat=False)
    assert holder.acquire()
    waiter = RIVALS[kind](client, "down")
    waiting = BackgroundAcquire(waiter, wait=30)
    keys = waiter.keys if kind != "multi" else waiter.keys[0]
    wait_for_subscriber(client, keys.channel)
    restartable_redis.stop()
    # A waiter blocked when Redis goes away holds nothing: it keeps trying within its wait.
    assert not waiting.done.wait(1.0)

    # A new acquire, with or without a wait, finds Redis down as it starts: it says so.
    for wait in (0.0, 5.0):
        fresh = make_handle(client, kind, "other")
        started = time.monotonic()
        with pytest.raises(LockBackendError):
            fresh.acquire(wait=wait)
        assert time.monotonic() - started < 2.0
        assert not fresh.held and not fresh.lost

    # Redis back (empty): the blocked waiter takes the free name there.
    restartable_redis.start()
    waiting.finish(20)
    assert waiting.errors == [] and waiting.results == [True] and waiter.held
    waiter.release()

    # Once Redis is back (empty), the same client takes the lock again.
    restartable_redis.start()
    again = make_handle(client, kind, "down", ttl=30)
    assert again.acquire()
    assert holders(client, kind) == hold_of(again)
    assert_every_key_expires(client)
    again.release()
    assert_every_key_expires(client)
