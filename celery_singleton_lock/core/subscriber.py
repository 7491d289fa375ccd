"""Each waiting thread's own pub/sub connection, which the waiter reads itself.

A blocked acquirer subscribes to its lock's channel on a connection of its thread's, waits
until Redis confirms the subscription (so its next attempt comes after it: a release then
is heard), and sleeps in a read of that connection until a release is published or its hint
runs out. The message is read on the thread that acts on it: no listener thread to wake it,
which a shared listener costs (about 0.1 ms a hand-off here, a wake-up across CPUs).

The connection is kept for the thread's next wait and closed when the thread ends, when it
has not been waited on for ``IDLE_TIMEOUT`` seconds (a threads pool's threads live as long as
the worker, and each would otherwise hold one), or with the client.

A waiter does not send its UNSUBSCRIBE on its way out of ``acquire`` (that send costs about
0.05 ms of a hand-off here): it notes the channels it left, and a thread of the client's,
the unsubscriber, sends it once it gets to run, unless the thread subscribed again first.
Nobody waits for its reply: the thread's next subscribe reads past it (and past any message
published before it).

A connection that fails while waiting wakes the waiter to look again; its next wait opens a
new one and subscribes again before sleeping. Under gevent or eventlet a thread is a greenlet,
and the waiters share one listener instead (notifier.py), as they do on a capped pool.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from .forking import reset_in_child
from .redis_urls import pubsub_connection

log = logging.getLogger("celery_singleton_lock.waiting")

#: A waiter waits at most this long for Redis to confirm its subscription.
SUBSCRIBE_TIMEOUT = 1.0
#: How long a waiter whose connection cannot be opened sleeps at most before it looks again
#: (and the longest a listener waits before it reconnects).
RECONNECT_DELAY_MAX = 2.0
#: The errors that mean a pub/sub connection is gone (or never came): the waiter looks again.
CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)
#: A thread's connection nobody waited on for this long is closed (its next wait opens one).
IDLE_TIMEOUT = 60.0


class _Subscriber:
    """One thread's pub/sub connection (None until opened, or after it failed), the
    process it was made in, and whether the client closed it."""

    __slots__ = (
        "connection", "pid", "closed", "busy", "left", "left_at", "sending", "__weakref__",
    )  # fmt: skip

    def __init__(self) -> None:
        self.connection: Any = None
        self.pid = os.getpid()
        self.closed = False
        self.busy = False  # a waiter of the thread is subscribed on it
        #: Channels its last waiter left, still subscribed until the unsubscriber runs.
        self.left: frozenset[bytes] = frozenset()
        #: When its last waiter left (``time.monotonic``).
        self.left_at = 0.0
        #: Held for a send: the thread's own and the unsubscriber's.
        self.sending = threading.Lock()

    def unsubscribe_left(self) -> None:
        """The unsubscriber's step: UNSUBSCRIBE what its last waiter left, unless the
        thread subscribed again meanwhile (which took ``left``)."""
        with self.sending:
            left, self.left = self.left, frozenset()
            if not left or self.connection is None or self.pid != os.getpid():
                return
            try:
                self.connection.send_command("UNSUBSCRIBE", *left)
            except Exception:  # gone, or closed under it: the next wait opens a new one
                self.drop()

    def close_if_idle(self, left_before: float) -> bool:
        """The unsubscriber's other step: close the connection if no waiter has been on it
        since ``left_before``. Under the send lock, which a waiter's subscribe takes before
        it touches the connection: a waiter that comes meanwhile opens a new one."""
        with self.sending:
            if (
                self.busy
                or self.connection is None
                or self.left_at > left_before
                or self.pid != os.getpid()
            ):
                return False
            self.left = frozenset()  # closing the connection unsubscribes
            self.drop()
            return True

    def drop(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None and self.pid == os.getpid():
            with contextlib.suppress(Exception):
                connection.disconnect()

    def __del__(self) -> None:
        # The thread ended (its thread-local storage held the only reference). Not in a
        # forked child: the socket is the parent's.
        try:
            self.drop()
        except Exception:  # a finalizer must not raise (at exit, modules may be torn down)
            return


class _ThreadSubscriber(threading.local):
    subscriber: _Subscriber | None = None


class Subscription:
    """What a waiter sleeps on: its channels, subscribed on its thread's connection."""

    __slots__ = ("_subscriber", "_channels", "_redis", "_woken", "_live")

    def __init__(
        self, subscriber: _Subscriber, channels: tuple[bytes, ...], redis_client: Any
    ) -> None:
        self._subscriber = subscriber
        self._channels = frozenset(channels)
        self._redis = redis_client
        self._woken = False  # a message came while subscribing
        self._live = False

    def wait(self, timeout: float | None = None) -> bool:
        """True once a release was published on one of the channels since the last
        ``wait`` (or the connection failed, and a release may have gone unheard); False
        after ``timeout`` seconds."""
        if self._woken:
            self._woken = False
            return True
        subscriber = self._subscriber
        if not self._live:
            # The connection failed since the last attempt: subscribe anew, then look again
            # (a release may have come meanwhile). If it cannot, sleep as a listener that
            # reconnects would (closed by the client: until the hint), then look again.
            if self.subscribe():
                return True
            pause = RECONNECT_DELAY_MAX if timeout is None else timeout
            if not subscriber.closed:
                pause = min(pause, RECONNECT_DELAY_MAX)
            time.sleep(pause)
            return False
        connection = subscriber.connection
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and (remaining <= 0 or not connection.can_read(remaining)):
                    return False
                if self._is_message(connection.read_response()):
                    return True
        except CONNECTION_ERRORS as exc:
            log.debug("pub/sub connection lost while waiting: %s", exc)
        except Exception as exc:  # closed under the read: redis-py fails in ways of its own
            if not subscriber.closed:
                log.debug("pub/sub read failed: %r", exc)
        self._live = False
        subscriber.drop()
        return True

    def _is_message(self, reply: Any) -> bool:
        return (
            isinstance(reply, list)
            and len(reply) == 3
            and reply[0] in (b"message", "message")
            and _channel(reply[1]) in self._channels
        )

    def subscribe(self) -> bool:
        """Subscribe (opening the thread's connection if need be) and wait, at most
        ``SUBSCRIBE_TIMEOUT``, for Redis to confirm. False if it could not be sent."""
        subscriber = self._subscriber
        if subscriber.closed:
            return False
        try:
            with subscriber.sending:
                # What the thread's last waiter left and the unsubscriber has not sent yet:
                # gone now, but for these channels, subscribed again.
                left, subscriber.left = subscriber.left, frozenset()
                connection = self._ready_connection()
                if left - self._channels:
                    connection.send_command("UNSUBSCRIBE", *(left - self._channels))
                connection.send_command("SUBSCRIBE", *self._channels)
            pending = set(self._channels)
            deadline = time.monotonic() + SUBSCRIBE_TIMEOUT
            while pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not connection.can_read(remaining):
                    break  # not confirmed in time: the waiter falls back to its hint
                reply = connection.read_response()
                if not isinstance(reply, list) or len(reply) < 2:
                    continue
                channel = _channel(reply[1])
                if reply[0] in (b"subscribe", "subscribe"):
                    pending.discard(channel)
                elif self._is_message(reply) and channel not in pending:
                    self._woken = True  # published right after its confirmation
                # Anything else is older than this subscription: the last one's replies.
        except CONNECTION_ERRORS as exc:
            log.debug("pub/sub subscribe failed: %s", exc)
            subscriber.drop()
            return False
        except redis.ResponseError as exc:  # no right to SUBSCRIBE: hints only
            log.warning("pub/sub subscribe refused (waiters fall back to hints): %s", exc)
            subscriber.drop()
            return False
        except Exception as exc:  # closed under the read: redis-py fails in ways of its own
            if not subscriber.closed:
                log.warning("pub/sub subscribe failed (the waiter falls back to its hint): %r", exc)
            subscriber.drop()
            return False
        self._live = True
        return True

    def _ready_connection(self) -> Any:
        """The thread's connection with nothing left to read: replies to its last waiter's
        UNSUBSCRIBE and messages before it are read past; one the server closed while it
        was idle is replaced."""
        subscriber = self._subscriber
        connection = subscriber.connection
        if connection is not None:
            try:
                while connection.can_read(0):
                    connection.read_response()
                return connection
            except CONNECTION_ERRORS:
                subscriber.drop()
        connection = subscriber.connection = pubsub_connection(self._redis)
        connection.connect()
        return connection

    def leave(self) -> bool:
        """Note the channels as left, for the unsubscriber; True if there is something
        for it to send."""
        if not self._live:
            return False
        self._live = False
        subscriber = self._subscriber
        with subscriber.sending:
            subscriber.left = self._channels
            subscriber.left_at = time.monotonic()
        return True


class ThreadSubscribers:
    """The pub/sub connections of every thread that waits through one client."""

    #: Seconds a thread's connection may go unused before the unsubscriber closes it.
    idle_timeout = IDLE_TIMEOUT

    def __init__(self, redis_client: Any) -> None:
        self._redis = redis_client
        self._local = _ThreadSubscriber()
        self._lock = threading.Lock()
        self._all: weakref.WeakSet[_Subscriber] = weakref.WeakSet()
        #: Subscribers whose waiter left, for the unsubscriber (a C queue: putting one in
        #: neither drops the GIL nor runs Python code, unlike an Event).
        self._left: queue.SimpleQueue[_Subscriber | None] = queue.SimpleQueue()
        self._unsubscriber: threading.Thread | None = None
        reset_in_child(self)

    def _reset_after_fork(self) -> None:
        # A lock another thread held at the fork (the unsubscriber sweeping, a thread adding
        # its subscriber) would stay held in the child, where that thread does not run; the
        # child has no unsubscriber either. The subscribers are the parent's: each thread of
        # the child makes its own (they know the process they were made in).
        self._lock = threading.Lock()
        self._all = weakref.WeakSet()
        self._left = queue.SimpleQueue()
        self._unsubscriber = None

    @contextmanager
    def listening(self, *channels: bytes) -> Iterator[Subscription]:
        """Subscribed to ``channels`` on this thread's connection for the duration of the
        block; yields what the waiter sleeps on."""
        subscriber = self._subscriber()
        if subscriber.busy:
            # A wait inside a wait of the same thread (a signal handler): reading the same
            # connection would take the outer waiter's messages. A connection of its own.
            subscriber = _Subscriber()
        subscriber.busy = True
        subscription = Subscription(subscriber, channels, self._redis)
        try:
            subscription.subscribe()
            yield subscription
        finally:
            if subscriber is not self._local.subscriber:
                subscriber.drop()  # closing it unsubscribes
            elif subscription.leave():  # (still busy: its leaving time is noted first)
                self._left.put(subscriber)
            subscriber.busy = False

    def _unsubscribe_left(self, left: queue.SimpleQueue[_Subscriber | None]) -> None:
        """The unsubscriber's loop, until close() puts None in: it sends what waiters left,
        and closes the connections nobody has waited on for ``idle_timeout`` seconds."""
        swept = time.monotonic()
        while True:
            try:
                subscriber = left.get(timeout=self.idle_timeout / 2)
            except queue.Empty:
                pass  # nobody left meanwhile: only the sweep
            else:
                if subscriber is None:
                    return
                subscriber.unsubscribe_left()
            now = time.monotonic()
            if now - swept >= self.idle_timeout / 2:
                swept = now
                self._close_idle(now - self.idle_timeout)

    def _close_idle(self, left_before: float) -> None:
        with self._lock:
            subscribers = list(self._all)
        closed = sum(subscriber.close_if_idle(left_before) for subscriber in subscribers)
        if closed:
            log.debug("closed %d idle pub/sub connection(s)", closed)

    def _ensure_unsubscriber(self) -> None:
        """Start the unsubscriber if this process has none (a first wait, a fork, a close)."""
        with self._lock:
            if self._unsubscriber is None or not self._unsubscriber.is_alive():
                self._unsubscriber = threading.Thread(
                    target=self._unsubscribe_left, args=(self._left,),
                    name="celery_singleton_lock-unsubscribing", daemon=True,
                )  # fmt: skip
                self._unsubscriber.start()

    def _subscriber(self) -> _Subscriber:
        subscriber = self._local.subscriber
        if subscriber is None or subscriber.closed or subscriber.pid != os.getpid():
            subscriber = self._local.subscriber = _Subscriber()
            with self._lock:
                self._all.add(subscriber)
            self._ensure_unsubscriber()
        return subscriber

    def close(self) -> None:
        """Close every thread's connection; a waiter in a read falls back to its hint, and
        a later waiter opens a new one."""
        with self._lock:
            subscribers, self._all = list(self._all), weakref.WeakSet()
            self._left.put(None)
            self._left, self._unsubscriber = queue.SimpleQueue(), None
        for subscriber in subscribers:
            subscriber.closed = True
            subscriber.drop()


def _channel(name: Any) -> Any:
    return name.encode() if isinstance(name, str) else name
