"""Waiting threads are woken through the one pub/sub connection their client shares per
process (core/notifier.py): however many threads wait, on however many names, the client
has one pub/sub connection; and every way it can go (killed while a thread waits, a wait
inside a wait, a forked child) ends with the waiter woken by a release, not its hint.

Every holder here has a 60 s lease: a waiter that were left to its hint would sit for a
minute, so a waiter back within seconds was woken by the release.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from support.forked import FORKS_WITH_THREADS, run_in_child
from support.waiting import BackgroundAcquire, wait_for, wait_for_subscriber

from celery_singleton_lock import Lease, LockClient

TTL = 60.0
#: Far less than TTL: a waiter back within this was woken by the release.
WOKEN_WITHIN = 10.0


def subscribers(client: LockClient, channel: bytes) -> int:
    return int(dict(client.redis.pubsub_numsub(channel)).get(channel, 0))


class OneThread:
    """Runs what it is given on one thread of its own, one call at a time."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            call, results = item
            try:
                results.put((True, call()))
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                results.put((False, exc))

    def start(self, call: Callable[[], Any]) -> queue.SimpleQueue[Any]:
        results: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._calls.put((call, results))
        return results

    def run(self, call: Callable[[], Any]) -> Any:
        return finish(self.start(call), WOKEN_WITHIN)

    def stop(self) -> None:
        self._calls.put(None)
        self._thread.join(10)


def finish(results: queue.SimpleQueue[Any], timeout: float) -> Any:
    ok, value = results.get(timeout=timeout)
    if not ok:
        raise value
    return value


@pytest.fixture
def worker() -> Iterator[OneThread]:
    thread = OneThread()
    yield thread
    thread.stop()


@pytest.fixture
def holder(lock_client: LockClient) -> Lease:
    return lock_client.lease("own", ttl=TTL)


@pytest.fixture
def waiter(lock_client: LockClient) -> Lease:
    return lock_client.lease("own", ttl=TTL)


def wait_once(lock_client: LockClient, holder: Lease, waiter: Lease, worker: OneThread) -> float:
    """``holder`` holds; ``waiter`` waits on ``worker``'s thread until the holder releases;
    returns how long its acquire took after the release."""
    assert holder.acquire()
    started = worker.start(lambda: waiter.acquire(wait=TTL))
    wait_for_subscriber(lock_client, waiter.keys.channel)
    released = time.monotonic()
    holder.release()
    assert finish(started, WOKEN_WITHIN + TTL) is True
    took = time.monotonic() - released
    worker.run(waiter.release)
    return took


def test_a_waiting_thread_is_woken_by_the_release(
    lock_client: LockClient, holder: Lease, waiter: Lease, worker: OneThread
) -> None:
    assert wait_once(lock_client, holder, waiter, worker) < WOKEN_WITHIN
    wait_for(lambda: subscribers(lock_client, waiter.keys.channel) == 0, 10, "the unsubscribe")
    assert wait_once(lock_client, holder, waiter, worker) < WOKEN_WITHIN


def pubsub_connections(admin: redis.Redis, name: str) -> int:
    """The server's pub/sub connections that carry the client name ``name``."""
    return sum(1 for entry in admin.client_list(_type="pubsub") if entry.get("name") == name)


def test_threads_waiting_on_several_names_share_one_pub_sub_connection(
    lock_redis_url: str, lock_prefix: str
) -> None:
    """Three threads wait, each on a name of its own, each once the one before it is
    subscribed: the client has one pub/sub connection, and each release wakes its waiter."""
    name = f"waiters-{uuid.uuid4().hex[:12]}"
    client = LockClient(redis.Redis.from_url(lock_redis_url, client_name=name), prefix=lock_prefix)
    try:
        holders = [client.lease(lock, ttl=TTL) for lock in ("one", "two", "three")]
        blocked = []
        for holder in holders:
            assert holder.acquire()
            waiter = client.lease(holder.name, ttl=TTL)
            blocked.append((waiter, BackgroundAcquire(waiter, wait=TTL)))
            wait_for_subscriber(client, holder.keys.channel)
        assert pubsub_connections(client.redis, name) == 1
        for holder, (waiter, waiting) in zip(holders, blocked, strict=True):
            released = time.monotonic()
            holder.release()
            waiting.finish(WOKEN_WITHIN)
            assert waiting.results == [True] and time.monotonic() - released < WOKEN_WITHIN
            waiter.release()
    finally:
        client.close()


def test_threads_waiting_on_one_name_take_it_in_turn(
    lock_client: LockClient, holder: Lease
) -> None:
    assert holder.acquire()
    waiters = [lock_client.lease("own", ttl=TTL) for _ in range(2)]
    blocked = [BackgroundAcquire(w, wait=TTL) for w in waiters]
    notifier: Any = lock_client.connection.notifier
    wait_for(lambda: notifier.subscriptions.waiters(holder.keys.channel) == 2, 10, "both waiters")
    release_to_both(holder, waiters, blocked)


def release_to_both(holder: Lease, waiters: list[Lease], blocked: list[BackgroundAcquire]) -> None:
    """``holder`` releases; the two blocked ``waiters`` are woken and take it in turn."""
    holder.release()
    wait_for(lambda: any(b.done.is_set() for b in blocked), WOKEN_WITHIN, "the first waiter")
    first = next(i for i, b in enumerate(blocked) if b.done.is_set())
    waiters[first].release()
    for b in blocked:
        b.finish(WOKEN_WITHIN)
        assert b.results == [True] and b.errors == []
    waiters[1 - first].release()


def test_a_connection_killed_while_waiting_looks_again_and_is_woken_by_the_release(
    lock_client: LockClient, holder: Lease, waiter: Lease
) -> None:
    assert holder.acquire()
    blocked = BackgroundAcquire(waiter, wait=TTL)
    wait_for_subscriber(lock_client, waiter.keys.channel)
    old = lock_client.connection.notifier.connection
    lock_client.redis.client_kill_filter(_type="pubsub")
    # It looks again (the lock is still held) and subscribes on a new connection.
    wait_for(
        lambda: (
            lock_client.connection.notifier.connection not in (None, old)
            and subscribers(lock_client, waiter.keys.channel) == 1
        ),
        10,
        "a new subscription",
    )
    released = time.monotonic()
    holder.release()
    blocked.finish(WOKEN_WITHIN + TTL)
    assert blocked.results == [True] and time.monotonic() - released < WOKEN_WITHIN
    waiter.release()


def test_a_wait_inside_a_wait_of_the_same_thread_is_woken_too(lock_client: LockClient) -> None:
    """A wait begun while the thread waits already (a signal handler's): each is woken by
    its own channel's message, and leaving both unsubscribes both."""
    notifier = lock_client.connection.notifier
    outer_channel = lock_client.connection.keys("outer").channel
    inner_channel = lock_client.connection.keys("inner").channel
    with notifier.listening(outer_channel) as outer:
        with notifier.listening(inner_channel) as inner:
            lock_client.redis.publish(outer_channel, b"released")
            lock_client.redis.publish(inner_channel, b"released")
            assert inner.wait(WOKEN_WITHIN) is True
        assert outer.wait(WOKEN_WITHIN) is True  # its message was left for it
        assert subscribers(lock_client, outer_channel) == 1
    wait_for(
        lambda: (
            subscribers(lock_client, outer_channel) + subscribers(lock_client, inner_channel) == 0
        ),
        10,
        "both unsubscribes",
    )


def _child_waits(lock_client: LockClient) -> dict[str, Any]:
    holder = lock_client.lease("forked", ttl=TTL)
    waiter = lock_client.lease("forked", ttl=TTL)
    assert holder.acquire()

    def release_once_waiting() -> None:
        wait_for(lambda: subscribers(lock_client, waiter.keys.channel) >= 1, 10, "the waiter")
        holder.release()

    releaser = threading.Thread(target=release_once_waiting)
    releaser.start()
    started = time.monotonic()
    got = waiter.acquire(wait=TTL)
    took = time.monotonic() - started
    releaser.join(10)
    threads = lock_client.connection.notifier.threads
    waiter.release()
    return {"got": got, "took": took, "own_listener": bool(threads)}


@pytest.mark.timeout(60)
@FORKS_WITH_THREADS
def test_a_forked_child_waits_through_a_listener_of_its_own(
    lock_client: LockClient, holder: Lease, waiter: Lease, worker: OneThread
) -> None:
    # The parent's listener runs first; the child must not read (or close) its connection.
    wait_once(lock_client, holder, waiter, worker)
    connection = lock_client.connection.notifier.connection
    report = worker.run(lambda: run_in_child(lambda: _child_waits(lock_client)))
    assert report.get("error") is None, report.get("error")
    assert report["got"] is True and report["took"] < WOKEN_WITHIN
    assert report["own_listener"] is True
    # The parent's listener still serves it, on the same connection.
    assert wait_once(lock_client, holder, waiter, worker) < WOKEN_WITHIN
    assert lock_client.connection.notifier.connection is connection


@pytest.mark.timeout(60)
@FORKS_WITH_THREADS
def test_a_child_forked_while_the_notifiers_lock_is_held_still_waits(
    lock_client: LockClient, holder: Lease, waiter: Lease, worker: OneThread
) -> None:
    """Another thread (a waiter subscribing, the unsubscriber) may hold the notifier's lock
    at the moment a thread forks: the child must not inherit it held."""
    wait_once(lock_client, holder, waiter, worker)  # the listener runs in this process
    notifier = lock_client.connection.notifier
    conn = notifier.connection
    assert conn is not None
    # A waiter subscribing holds the notifier's lock while it sends its SUBSCRIBE: held
    # here, across the fork, by a connection that takes its time to send it.
    sending, sent = threading.Event(), threading.Event()
    send = conn.send_command

    def slow_send(*args: Any, **kwargs: Any) -> Any:
        sending.set()
        sent.wait(60)
        return send(*args, **kwargs)

    def subscribe() -> None:
        with notifier.listening(lock_client.connection.keys("fork-held").channel):
            pass

    conn.send_command = slow_send
    subscriber = threading.Thread(target=subscribe, daemon=True)
    subscriber.start()
    try:
        assert sending.wait(10)
        forked = worker.start(lambda: run_in_child(lambda: _child_waits(lock_client), alarm=30))
        report = finish(forked, 40)  # a child stuck on the lock is ended by its alarm
    finally:
        sent.set()
        subscriber.join(10)
        del conn.send_command
    assert report["got"] is True and report["took"] < WOKEN_WITHIN


def test_clients_on_one_pool_share_its_pub_sub_connection_until_the_last_one_closes(
    lock_redis_url: str, lock_prefix: str
) -> None:
    """Two lock clients on one pool (as one made per request would be): their waiters share
    one pub/sub connection; closing one leaves it to the other, whose waiter is woken by the
    release; closing the last one closes it."""
    name = f"pool-{uuid.uuid4().hex[:12]}"
    pool = redis.ConnectionPool.from_url(lock_redis_url, client_name=name)
    first, second = (
        LockClient(redis.Redis(connection_pool=pool), prefix=lock_prefix) for _ in range(2)
    )
    try:
        # "a" is held for 2 s at a time: once nothing listens, its waiter's hint is short.
        pairs = [(client.lease(lock, ttl=ttl), client.lease(lock, ttl=TTL))
                 for client, lock, ttl in ((first, "a", 2.0), (second, "b", TTL))]  # fmt: skip
        blocked = []
        for holder, waiter in pairs:
            assert holder.acquire()
            blocked.append(BackgroundAcquire(waiter, wait=TTL))
            wait_for_subscriber(first, holder.keys.channel)
        assert pubsub_connections(first.redis, name) == 1
        first.close()
        (holder, waiter), waiting = pairs[1], blocked[1]
        released = time.monotonic()
        holder.release()
        waiting.finish(WOKEN_WITHIN)
        assert waiting.results == [True] and time.monotonic() - released < WOKEN_WITHIN
        waiter.release()
        assert pubsub_connections(first.redis, name) == 1  # still subscribed for "a"
        second.close()
        wait_for(lambda: pubsub_connections(first.redis, name) == 0, 10, "the listener to close")
        pairs[0][0].release()
        blocked[0].finish(WOKEN_WITHIN)  # unheard now: it takes the name at its hint
        assert blocked[0].results == [True]
        pairs[0][1].release()
    finally:
        first.close()
        second.close()
        pool.disconnect()
