"""The pub/sub listener that wakes a client's blocked acquirers: its QueueWakeup, and the
channel a waiter leaves, which a thread of the listener unsubscribes after the waiter has
returned; its threads ending, quietly, when a client closes. (Whole waits through it:
test_waiting_threads.py.)

The interleavings are driven by hand: the test swaps in a queue of channels left that the
unsubscriber does not read, and runs the unsubscriber's step itself where the interleaving
needs it. Everything else is the real listener on a real Redis.
"""

from __future__ import annotations

import logging
import queue
import subprocess
import sys
import threading

import pytest
from support.waiting import wait_for, wait_for_subscriber

from celery_singleton_lock import LockClient
from celery_singleton_lock.core.notifier import Notifier, QueueWakeup
from celery_singleton_lock.kinds.lease import Lease


def subscribers(client: LockClient, channel: bytes) -> int:
    return int(dict(client.redis.pubsub_numsub(channel)).get(channel, 0))


@pytest.fixture
def notifier(lock_client: LockClient) -> Notifier:
    return lock_client.connection.notifier


def channel_of(lock_client: LockClient, name: str) -> bytes:
    return lock_client.connection.keys(name).channel


def hold_left_channels(notifier: Notifier) -> queue.SimpleQueue[bytes]:
    """Channels left from now on queue where the unsubscriber does not look; returns it."""
    with notifier._lock:
        notifier._ensure_threads()
        held: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        notifier._left = held
    return held


def drained(left: queue.SimpleQueue[bytes]) -> set[bytes]:
    channels = set()
    while not left.empty():
        channels.add(left.get_nowait())
    return channels


def test_wakeup_set_before_wait_wakes_at_once_and_sets_meanwhile_are_one() -> None:
    wakeup = QueueWakeup()
    assert wakeup.wait(0) is False
    wakeup.set()
    wakeup.set()
    assert wakeup.wait(5) is True
    assert wakeup.wait(0.01) is False  # both sets were one wake-up


def test_wakeup_wakes_a_thread_blocked_in_wait() -> None:
    wakeup = QueueWakeup()
    results: list[bool] = []
    waiting = threading.Thread(target=lambda: results.append(wakeup.wait(30)))
    waiting.start()
    wakeup.set()
    waiting.join(10)
    assert results == [True]


def test_the_last_waiter_leaving_unsubscribes(lock_client: LockClient, notifier: Notifier) -> None:
    channel = channel_of(lock_client, "leaving")
    with notifier.listening(channel):
        assert subscribers(lock_client, channel) == 1
    wait_for(lambda: subscribers(lock_client, channel) == 0, 10, "the unsubscribe")
    assert not notifier.listens_to(channel)


def test_a_waiter_back_before_the_unsubscribe_keeps_the_subscription(
    lock_client: LockClient, notifier: Notifier
) -> None:
    channel = channel_of(lock_client, "back")
    left = hold_left_channels(notifier)
    with notifier.listening(channel):
        pass
    assert drained(left) == {channel}
    subscribed = notifier.subscriptions.subscribes_sent(channel)
    with notifier.listening(channel) as wakeup:
        # No second SUBSCRIBE: the subscription is still live.
        assert notifier.subscriptions.subscribes_sent(channel) == subscribed
        notifier._unsubscribe({channel})  # the unsubscriber's step, after the waiter came back
        assert subscribers(lock_client, channel) == 1
        lock_client.redis.publish(channel, b"released")
        assert wakeup.wait(10) is True
    notifier._unsubscribe(drained(left))
    wait_for(lambda: subscribers(lock_client, channel) == 0, 10, "the unsubscribe")


def test_one_wakeup_listens_on_several_channels(
    lock_client: LockClient, notifier: Notifier
) -> None:
    first, second = channel_of(lock_client, "one"), channel_of(lock_client, "two")
    with notifier.listening(first, second) as wakeup:
        assert subscribers(lock_client, first) == subscribers(lock_client, second) == 1
        lock_client.redis.publish(second, b"released")
        assert wakeup.wait(10) is True
        lock_client.redis.publish(first, b"released")
        assert wakeup.wait(10) is True
    wait_for(
        lambda: subscribers(lock_client, first) + subscribers(lock_client, second) == 0,
        10,
        "both unsubscribes",
    )


def test_a_reconnect_drops_channels_left_rather_than_subscribing_them_again(
    lock_client: LockClient, notifier: Notifier
) -> None:
    left_behind, live = channel_of(lock_client, "left"), channel_of(lock_client, "live")
    hold_left_channels(notifier)
    with notifier.listening(live) as wakeup:
        with notifier.listening(left_behind):
            pass
        assert subscribers(lock_client, left_behind) == 1  # not unsubscribed (held)
        old = notifier.connection
        lock_client.redis.client_kill_filter(_type="pubsub")
        wait_for(
            lambda: notifier.connection not in (None, old) and subscribers(lock_client, live) == 1,
            10,
            "the listener to reconnect",
        )
        assert subscribers(lock_client, left_behind) == 0
        assert not notifier.listens_to(left_behind)
        assert wakeup.wait(10) is True  # the drop woke the waiter to look again
        lock_client.redis.publish(live, b"released")
        assert wakeup.wait(10) is True


def test_a_closed_notifier_starts_again_for_a_later_waiter(
    lock_client: LockClient, notifier: Notifier
) -> None:
    channel = channel_of(lock_client, "again")
    with notifier.listening(channel):
        pass
    threads = notifier.threads
    assert len(threads) == 2  # the listener and the unsubscriber
    notifier.close()
    for ended in threads:
        ended.join(10)
    assert notifier.threads == ()
    with notifier.listening(channel) as wakeup:
        # A new listener thread and connection: on a loaded machine the confirmation may come
        # after listening() stopped waiting for it (SUBSCRIBE_TIMEOUT); it must still come.
        wait_for(lambda: subscribers(lock_client, channel) == 1, 10, "the new subscription")
        lock_client.redis.publish(channel, b"released")
        assert wakeup.wait(10) is True
    wait_for(lambda: subscribers(lock_client, channel) == 0, 10, "the unsubscribe")


#: Run in a process of its own, after the patch: a holder with a 60 s lease releases 0.3 s
#: after a waiter blocked, while another green thread ticks every 10 ms. Prints the seconds
#: the waiter took and the ticks counted meanwhile.
GREEN_WAIT = """
import sys, threading, time
from celery_singleton_lock import LockClient
url, prefix = sys.argv[1:3]
holder = LockClient.from_url(url, prefix=prefix).lease("green", ttl=60)
waiter = LockClient.from_url(url, prefix=prefix).lease("green", ttl=60)
assert holder.acquire()
ticks, waited = [0], []
def tick():
    while not waited:
        ticks[0] += 1
        time.sleep(0.01)
def wait():
    started = time.monotonic()
    assert waiter.acquire(wait=30)
    waited.append(time.monotonic() - started)
    waiter.release()
threads = [threading.Thread(target=tick), threading.Thread(target=wait)]
for thread in threads:
    thread.start()
time.sleep(0.3)
holder.release()
for thread in threads:
    thread.join()
print(waited[0], ticks[0])
"""


@pytest.mark.parametrize(
    "patch",
    ["import gevent.monkey; gevent.monkey.patch_all()", "import eventlet; eventlet.monkey_patch()"],
    ids=["gevent", "eventlet"],
)
def test_under_green_threads_a_waiter_is_woken_without_blocking_the_others(
    patch: str, lock_redis_url: str, lock_prefix: str
) -> None:
    """The waiters' queues are the patched, cooperative ones: a blocked waiter lets the
    other green threads run, and the release wakes it long before its 60 s hint."""
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", f"{patch}\n{GREEN_WAIT}", lock_redis_url,
         lock_prefix],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    waited, ticks = done.stdout.split()
    assert float(waited) < 10
    assert int(ticks) >= 10  # the ticker ran while the waiter was blocked (0.3 s at least)


@pytest.mark.parametrize("close_while", ["after-acquire", "while-waiting"])
def test_close_after_a_waiting_acquire_is_quiet_and_closes_the_waiters_connection(
    lock_redis_url: str, lock_prefix: str, caplog: pytest.LogCaptureFixture, close_while: str
) -> None:
    """Closing is not an error: the listener's blocked read sees its connection closed under
    it, and logs nothing (no ``ERROR pub/sub listener error``, no traceback)."""
    caplog.set_level(logging.DEBUG, logger="celery_singleton_lock")
    # "after-acquire": the waiter must still be waiting when the release comes (a loaded
    # machine can take seconds to get there), and the release wakes it, so a long wait
    # costs nothing. "while-waiting": nothing wakes it once its listener is closed, so
    # it returns at the end of its wait, kept short.
    wait_s = 30.0 if close_while == "after-acquire" else 3.0
    for attempt in range(5):  # the race it had was lost in most runs, not all: try a few
        holder_client = LockClient.from_url(lock_redis_url, prefix=lock_prefix)
        client = LockClient.from_url(lock_redis_url, prefix=lock_prefix)
        name = f"quiet-{attempt}"
        holder = holder_client.lease(name, ttl=60.0)
        assert holder.acquire()
        waiter = client.lease(name, ttl=60.0)
        got: list[object] = []

        def wait(waiter: Lease = waiter, got: list[object] = got) -> None:
            try:
                got.append(waiter.acquire(wait_s))
            except Exception as exc:
                got.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        wait_for_subscriber(client, waiter.keys.channel)
        notifier = client.connection.notifier
        threads = notifier.threads
        assert len(threads) == 2  # the listener and the unsubscriber
        # The listener keeps its connection right after sending the SUBSCRIBE the server
        # already counts: it may not have got there yet.
        wait_for(
            lambda notifier=notifier: notifier.connection is not None,
            10,
            "the listener's connection",
        )
        if close_while == "after-acquire":
            holder.release()
            thread.join(10)
            assert got == [True]
            client.close()
        else:
            client.close()  # the waiter falls back to its hint, capped by its wait
            holder.release()
            thread.join(20)
            assert not thread.is_alive() and len(got) == 1, got
        for ended in threads:
            ended.join(10)
        assert notifier.threads == () and notifier.connection is None
        if got == [True]:
            waiter.release()
        holder_client.close()
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert noisy == [], [r.getMessage() for r in noisy]
