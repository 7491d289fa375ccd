"""Each waiting thread reads a pub/sub connection of its own (core/subscriber.py): woken on
the thread that acts on the release, the connection kept for the thread's next wait, and
every way that connection can go (killed while waiting, closed by the server while idle, a
wait inside a wait, a forked child) ends with the waiter woken by a release, not its hint.

Every holder here has a 60 s lease: a waiter that were left to its hint would sit for a
minute, so a waiter back within seconds was woken by the release.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from support.forked import run_in_child
from support.waiting import BackgroundAcquire, wait_for, wait_for_subscriber

from celery_singleton_lock import Lease, LockClient
from celery_singleton_lock.core.subscriber import ThreadSubscribers, _Subscriber

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


def own(lock_client: LockClient) -> ThreadSubscribers:
    return lock_client.connection.notifier.own


def wait_once(
    lock_client: LockClient, holder: Lease, waiter: Lease, worker: OneThread
) -> tuple[Any, float]:
    """``holder`` holds; ``waiter`` waits on ``worker``'s thread until the holder releases;
    returns the connection the waiter read and how long its acquire took after the release."""
    assert holder.acquire()
    started = worker.start(lambda: waiter.acquire(wait=TTL))
    wait_for_subscriber(lock_client, waiter._channel)
    released = time.monotonic()
    holder.release()
    assert finish(started, WOKEN_WITHIN + TTL) is True
    took = time.monotonic() - released
    connection = worker.run(lambda: own(lock_client)._local.subscriber.connection)
    worker.run(waiter.release)
    return connection, took


def test_a_waiting_thread_is_woken_on_its_own_connection_and_keeps_it(
    lock_client: LockClient, holder: Lease, waiter: Lease, worker: OneThread
) -> None:
    first, took = wait_once(lock_client, holder, waiter, worker)
    assert took < WOKEN_WITHIN
    assert lock_client.connection.notifier.shared._thread is None  # no listener thread
    wait_for(lambda: subscribers(lock_client, waiter._channel) == 0, 10, "the unsubscribe")
    second, took = wait_once(lock_client, holder, waiter, worker)
    assert took < WOKEN_WITHIN
    assert second is first  # the thread's connection, kept between its waits


def test_threads_waiting_on_one_name_each_subscribe_and_take_it_in_turn(
    lock_client: LockClient, holder: Lease
) -> None:
    assert holder.acquire()
    waiters = [lock_client.lease("own", ttl=TTL) for _ in range(2)]
    blocked = [BackgroundAcquire(w, wait=TTL) for w in waiters]
    wait_for(lambda: subscribers(lock_client, holder._channel) == 2, 10, "two subscriptions")
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
    wait_for_subscriber(lock_client, waiter._channel)
    lock_client.redis.client_kill_filter(_type="pubsub")
    # It looks again (the lock is still held) and subscribes on a new connection.
    wait_for(lambda: subscribers(lock_client, waiter._channel) == 1, 10, "a new subscription")
    released = time.monotonic()
    holder.release()
    blocked.finish(WOKEN_WITHIN + TTL)
    assert blocked.results == [True] and time.monotonic() - released < WOKEN_WITHIN
    waiter.release()


def test_a_connection_the_server_closed_while_idle_is_replaced_before_the_next_wait(
    lock_client: LockClient, holder: Lease, waiter: Lease, worker: OneThread
) -> None:
    first, _ = wait_once(lock_client, holder, waiter, worker)
    wait_for(lambda: subscribers(lock_client, waiter._channel) == 0, 10, "the unsubscribe")
    host, port = first._sock.getsockname()[:2]  # no subscription now: a plain client
    assert lock_client.redis.client_kill_filter(addr=f"{host}:{port}") == 1
    second, took = wait_once(lock_client, holder, waiter, worker)
    assert took < WOKEN_WITHIN
    assert second is not first


def server_side(connection: Any) -> str:
    """The server's ``addr`` of ``connection`` (what ``CLIENT LIST`` and ``CLIENT KILL`` name)."""
    host, port = connection._sock.getsockname()[:2]
    return f"{host}:{port}"


def connected(lock_client: LockClient, addr: str) -> bool:
    return any(c["addr"] == addr for c in lock_client.redis.client_list())


def test_a_connection_nobody_waits_on_is_closed_and_the_next_wait_opens_one(
    lock_client: LockClient, holder: Lease, waiter: Lease, worker: OneThread
) -> None:
    own(lock_client).idle_timeout = 0.3  # before the first wait starts the unsubscriber
    first, took = wait_once(lock_client, holder, waiter, worker)
    assert took < WOKEN_WITHIN
    addr = server_side(first)
    wait_for(
        lambda: not connected(lock_client, addr), 10, "the idle connection closed at the server"
    )
    assert worker.run(lambda: own(lock_client)._local.subscriber.connection) is None
    second, took = wait_once(lock_client, holder, waiter, worker)
    assert took < WOKEN_WITHIN  # woken by the release, on a connection of its own again
    assert second is not first


def test_the_idle_sweep_leaves_a_waiting_thread_s_connection_alone(
    lock_client: LockClient, holder: Lease, waiter: Lease
) -> None:
    subscribers_ = own(lock_client)
    subscribers_.idle_timeout = 0.05
    sweeps: list[float] = []
    sweep = subscribers_._close_idle

    def counted(left_before: float) -> None:
        sweep(left_before)
        sweeps.append(left_before)

    subscribers_._close_idle = counted  # type: ignore[method-assign]
    assert holder.acquire()
    blocked = BackgroundAcquire(waiter, wait=TTL)
    wait_for_subscriber(lock_client, waiter._channel)
    (subscriber,) = list(subscribers_._all)
    connection = subscriber.connection
    addr = server_side(connection)
    # Sweeps that would close it, were it idle, while it waits.
    wait_for(lambda: len(sweeps) >= 3, 10, "three idle sweeps")
    assert subscriber.connection is connection and connected(lock_client, addr)
    released = time.monotonic()
    holder.release()
    blocked.finish(WOKEN_WITHIN + TTL)
    assert blocked.results == [True] and time.monotonic() - released < WOKEN_WITHIN
    waiter.release()


def test_an_idle_close_takes_the_send_lock_a_subscribe_takes_first() -> None:
    """The sweep decides and closes under the connection's send lock, and reads whether a
    waiter is on it: a busy connection, one used since, or one of another process is left."""
    subscriber = _Subscriber()
    subscriber.connection = connection = redis.Connection()  # never connected
    subscriber.left_at = 10.0
    subscriber.busy = True
    assert subscriber.close_if_idle(left_before=20.0) is False
    subscriber.busy = False
    assert subscriber.close_if_idle(left_before=5.0) is False  # used after that
    subscriber.pid = -1
    assert subscriber.close_if_idle(left_before=20.0) is False  # not this process's
    subscriber.pid = os.getpid()
    closing = threading.Thread(target=subscriber.close_if_idle, args=(20.0,))
    with subscriber.sending:
        closing.start()
        closing.join(0.2)
        assert closing.is_alive() and subscriber.connection is connection  # waits for the lock
    closing.join(10)
    assert subscriber.connection is None


def test_waiters_on_a_capped_pool_share_one_pub_sub_connection(
    lock_redis_url: str, lock_prefix: str
) -> None:
    """A BlockingConnectionPool caps what the process opens: its waiters do not open a
    connection each, they share the listener's."""
    pool = redis.BlockingConnectionPool.from_url(lock_redis_url, max_connections=4, timeout=10)
    client = LockClient(redis.Redis(connection_pool=pool), prefix=lock_prefix)
    try:
        holder = client.lease("capped", ttl=TTL)
        waiters = [client.lease("capped", ttl=TTL) for _ in range(2)]
        assert holder.acquire()
        blocked = [BackgroundAcquire(w, wait=TTL) for w in waiters]
        shared = client.connection.notifier.shared
        channel = holder._channel

        def both_waiting() -> bool:
            state = shared._channels.get(channel)
            return state is not None and len(state.waiters) == 2

        wait_for(both_waiting, 10, "both waiters on the shared listener")
        assert subscribers(client, channel) == 1  # one connection subscribed for both
        assert list(own(client)._all) == []
        release_to_both(holder, waiters, blocked)
    finally:
        client.close()


def test_a_wait_inside_a_wait_of_the_same_thread_reads_a_connection_of_its_own(
    lock_client: LockClient,
) -> None:
    subscribers_ = own(lock_client)
    outer_channel = lock_client.connection.keys("outer").channel
    inner_channel = lock_client.connection.keys("inner").channel
    with subscribers_.listening(outer_channel) as outer:
        with subscribers_.listening(inner_channel) as inner:
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
        "both unsubscribes (and the inner connection closed)",
    )


def _child_waits(lock_client: LockClient) -> dict[str, Any]:
    holder = lock_client.lease("forked", ttl=TTL)
    waiter = lock_client.lease("forked", ttl=TTL)
    assert holder.acquire()

    def release_once_waiting() -> None:
        wait_for(lambda: subscribers(lock_client, waiter._channel) >= 1, 10, "the waiter")
        holder.release()

    releaser = threading.Thread(target=release_once_waiting)
    releaser.start()
    started = time.monotonic()
    got = waiter.acquire(wait=TTL)
    took = time.monotonic() - started
    releaser.join(10)
    subscriber = own(lock_client)._local.subscriber
    waiter.release()
    return {"got": got, "took": took, "own_pid": subscriber.pid}


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() with threads running
def test_a_forked_child_waits_on_a_connection_of_its_own(
    lock_client: LockClient, holder: Lease, waiter: Lease, worker: OneThread
) -> None:
    # The forking thread has a connection first; the child must not read (or close) it.
    connection, _ = wait_once(lock_client, holder, waiter, worker)
    report = worker.run(lambda: run_in_child(lambda: _child_waits(lock_client)))
    assert report.get("error") is None, report.get("error")
    assert report["got"] is True and report["took"] < WOKEN_WITHIN
    assert report["own_pid"] != os.getpid()
    # The parent's connection of that thread still serves it.
    again, took = wait_once(lock_client, holder, waiter, worker)
    assert took < WOKEN_WITHIN
    assert again is connection


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() with threads running
def test_a_child_forked_while_the_subscribers_lock_is_held_still_waits(
    lock_client: LockClient, holder: Lease, waiter: Lease, worker: OneThread
) -> None:
    """The unsubscriber's sweep (or a thread adding its connection) may hold the client's
    subscriber lock at the moment another thread forks: the child must not inherit it held."""
    wait_once(lock_client, holder, waiter, worker)  # the unsubscriber runs in this process
    with own(lock_client)._lock:  # held, as by the sweep, across the fork
        forked = worker.start(lambda: run_in_child(lambda: _child_waits(lock_client), alarm=30))
        report = finish(forked, 40)  # a child stuck on the lock is ended by its alarm
    assert report["got"] is True and report["took"] < WOKEN_WITHIN
    assert report["own_pid"] != os.getpid()


def test_a_thread_back_before_the_unsubscriber_ran_keeps_its_subscription(
    lock_client: LockClient, worker: OneThread
) -> None:
    """The unsubscriber's step comes after the thread subscribed again to the channel it had
    left: it must not unsubscribe the new waiter. (The test holds the unsubscriber back by
    giving the waiters a queue it does not read, and runs its step itself.)"""
    subscribers_ = own(lock_client)
    channel = lock_client.connection.keys("back").channel
    held: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def listen_once() -> Any:
        with subscribers_.listening(channel):
            pass
        return subscribers_._local.subscriber

    worker.run(listen_once)  # the thread's connection, and the unsubscriber, are there now
    wait_for(lambda: subscribers(lock_client, channel) == 0, 10, "the first unsubscribe")
    unsubscriber_queue, subscribers_._left = subscribers_._left, held
    subscriber = worker.run(listen_once)
    assert held.get_nowait() is subscriber and subscriber.left == {channel}
    assert subscribers(lock_client, channel) == 1  # left, not yet unsubscribed

    woken: queue.SimpleQueue[bool] = queue.SimpleQueue()
    waiting = threading.Event()
    late_step_done = threading.Event()

    def wait_again() -> None:
        with subscribers_.listening(channel) as subscription:
            waiting.set()
            late_step_done.wait(10)
            woken.put(subscription.wait(WOKEN_WITHIN))

    started = worker.start(wait_again)
    assert waiting.wait(10)
    subscriber.unsubscribe_left()  # the unsubscriber's step, late: nothing left to send
    late_step_done.set()
    assert subscribers(lock_client, channel) == 1
    lock_client.redis.publish(channel, b"released")
    assert woken.get(timeout=WOKEN_WITHIN) is True
    finish(started, 10)
    subscriber.unsubscribe_left()  # now it has left again: the step sends the UNSUBSCRIBE
    wait_for(lambda: subscribers(lock_client, channel) == 0, 10, "the unsubscribe")
    subscribers_._left = unsubscriber_queue  # so that close() stops the unsubscriber
