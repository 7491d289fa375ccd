"""How blocked acquirers are woken: by a release published on their lock's channel.

The waiters of every client on one connection pool (on a Cluster, of one client) share one
pub/sub connection per process, read by a listener thread (a greenlet under gevent or
eventlet). It is opened at the first wait with the pool's settings but no read timeout,
outside the pool: a pooled connection would be taken from the pool for good, and a
``BlockingConnectionPool`` of one would then block every lock call. So the library opens at
most the pool's ``max_connections`` plus this one.

A waiter subscribes to its lock's channel, waits until Redis confirms the subscription, tries
the lock once more (closing the race with a release that came before the subscription), then
sleeps until a release is published or until the holder's lease would run out (the hint the
acquire script returns), whichever comes first. A lost message therefore costs at most the
hint, never a missed lock; there is no polling loop.

The listener thread only reads; waiters send SUBSCRIBE themselves under a lock. Replies arrive
in the order commands were sent, so counting ``subscribe`` acknowledgements per channel tells
each waiter when *its* subscription is live.

The last waiter of a channel does not send the UNSUBSCRIBE on its way out of ``acquire``: that
send costs more than the rest of leaving. It marks the channel as left and a second thread,
the unsubscriber, sends it once it gets to run. Until then the subscription stays live: a
waiter that comes back meanwhile keeps it, with no SUBSCRIBE.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import redis

from .forking import reset_in_child
from .redis_urls import pubsub_connection, pubsub_source

#: Keeps the module's old name: logging configurations name it (docs/lease.md).
log = logging.getLogger("celery_singleton_lock.waiting")

#: A waiter waits at most this long for Redis to confirm its subscription.
SUBSCRIBE_TIMEOUT = 1.0
#: How long the listener waits before reconnecting after Redis went away (doubles up to
#: ``RECONNECT_DELAY_MAX``).
RECONNECT_DELAY = 0.05
RECONNECT_DELAY_MAX = 2.0
#: The errors that mean a pub/sub connection is gone (or never came): waiters look again.
CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)


class Wakeup(Protocol):
    """What a blocked acquirer sleeps on, from :meth:`Notifier.listening`."""

    def wait(self, timeout: float | None = None) -> bool:
        """True once a release was published on one of its channels since the last
        ``wait`` (or the connection dropped: a release may have gone unheard), False after
        ``timeout`` seconds."""


class QueueWakeup:
    """What a waiter of the shared listener sleeps on: set by each release published on its
    channels (and when the connection drops); ``wait`` returns once it was set since the
    last ``wait``.

    The listener's ``set`` is on the hand-off's path. A ``threading.Event``'s runs Python code
    under a Condition and wakes the waiter onto that Condition's lock, which the setter still
    holds; a C queue's ``put`` and ``get`` do neither, so the waiter is back sooner.
    """

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[None] = queue.SimpleQueue()

    def set(self) -> None:
        self._queue.put(None)

    def wait(self, timeout: float | None = None) -> bool:
        """True once set (at once if set since the last ``wait``), False after ``timeout``
        seconds; either way, it is unset again."""
        try:
            self._queue.get(timeout=timeout)
        except queue.Empty:
            return False
        with contextlib.suppress(queue.Empty):
            while True:  # sets that came meanwhile are one wake-up
                self._queue.get_nowait()
        return True


class _Channel:
    __slots__ = ("confirmed", "need", "waiters")

    def __init__(self) -> None:
        self.waiters: set[QueueWakeup] = set()
        self.confirmed = threading.Event()
        self.need = 0


class Notifier:
    """What wakes the blocked acquirers of the clients on one connection pool: one pub/sub
    connection and listener thread shared by all their waiters in one process (see
    :func:`notifier_for`)."""

    def __init__(self, redis_client: Any) -> None:
        # Weak: the registry keeps a notifier only as long as its pool lives (a client
        # made from a URL and dropped unclosed takes its pool with it).
        self._source = weakref.ref(pubsub_source(redis_client))
        #: The clients using it that have not closed (the last one to close stops it).
        self._users = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._channels: dict[bytes, _Channel] = {}
        self._sent: Counter[bytes] = Counter()
        self._acked: Counter[bytes] = Counter()
        self._conn: Any = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        #: Channels whose last waiter left, for the unsubscriber (a C queue: putting one in
        #: neither drops the GIL nor takes a Python-level lock, unlike an Event).
        self._left: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._unsubscriber: threading.Thread | None = None
        reset_in_child(self)

    def _reset_after_fork(self) -> None:
        # The child has no listener thread and must not read the parent's socket.
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._channels = {}
        self._sent = Counter()
        self._acked = Counter()
        self._conn = None
        self._thread = None
        self._closed = threading.Event()
        self._left = queue.SimpleQueue()
        self._unsubscriber = None

    @contextmanager
    def listening(self, *channels: bytes) -> Iterator[QueueWakeup]:
        """Subscribe to ``channels`` for the duration of the block.

        Yields a :class:`QueueWakeup` that is set by each message on any of them (and when the
        connection drops, so that waiters look again). On entry each subscription is
        confirmed, or ``SUBSCRIBE_TIMEOUT`` passed and the waiter falls back to its hint.
        """
        wakeup = QueueWakeup()
        try:
            confirmed = [self._add(channel, wakeup) for channel in channels]
            deadline = time.monotonic() + SUBSCRIBE_TIMEOUT
            for done in confirmed:
                done.wait(max(0.0, deadline - time.monotonic()))
            yield wakeup
        finally:
            for channel in channels:
                self._remove(channel, wakeup)

    def _add(self, channel: bytes, wakeup: QueueWakeup) -> threading.Event:
        with self._lock:
            self._ensure_threads()
            # A channel whose last waiter left is still subscribed until the unsubscriber
            # runs: this waiter keeps that subscription (and its confirmation).
            state = self._channels.get(channel)
            if state is None:
                state = self._channels[channel] = _Channel()
                self._send_locked("SUBSCRIBE", channel)
                state.need = self._sent[channel]
                if self._acked[channel] >= state.need:
                    state.confirmed.set()
            state.waiters.add(wakeup)
            return state.confirmed

    def _remove(self, channel: bytes, wakeup: QueueWakeup) -> None:
        with self._lock:
            state = self._channels.get(channel)
            if state is None:
                return
            state.waiters.discard(wakeup)
            if state.waiters:
                return
            left = self._left
        left.put(channel)

    def _unsubscribe_left(self, stop: threading.Event, left: queue.SimpleQueue[bytes]) -> None:
        """The unsubscriber's loop: UNSUBSCRIBE each channel left that no waiter came back
        to, until ``stop`` (close() then puts an empty name in to wake it)."""
        while True:
            channels = {left.get()}
            with contextlib.suppress(queue.Empty):
                while True:
                    channels.add(left.get_nowait())
            if stop.is_set():
                return
            self._unsubscribe(channels)

    def _unsubscribe(self, channels: set[bytes]) -> None:
        """UNSUBSCRIBE those of ``channels`` that no waiter came back to."""
        with self._lock:
            for channel in channels:
                state = self._channels.get(channel)
                if state is not None and not state.waiters:
                    del self._channels[channel]
                    self._send_locked("UNSUBSCRIBE", channel, count=False)

    def _send_locked(self, command: str, channel: bytes, *, count: bool = True) -> None:
        if count:
            self._sent[channel] += 1
        if self._conn is None:
            return  # the listener subscribes every live channel when it reconnects
        try:
            self._conn.send_command(command, channel)
        except CONNECTION_ERRORS:
            log.debug("pub/sub send failed; the listener will reconnect", exc_info=True)

    def _ensure_threads(self) -> None:
        if self._closed.is_set():
            # close() stopped the threads (or is stopping them): this waiter starts new ones.
            self._closed = threading.Event()
            self._left = queue.SimpleQueue()
            self._thread = self._unsubscriber = None
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, args=(self._closed,), name="celery_singleton_lock-waiting",
                daemon=True,
            )  # fmt: skip
            self._thread.start()
        if self._unsubscriber is None or not self._unsubscriber.is_alive():
            self._unsubscriber = threading.Thread(
                target=self._unsubscribe_left, args=(self._closed, self._left),
                name="celery_singleton_lock-unsubscribing", daemon=True,
            )  # fmt: skip
            self._unsubscriber.start()

    def _connect(self, stop: threading.Event) -> Any:
        source = self._source()
        if source is None:  # the pool is gone, and with it every client that could wait
            stop.set()
            return None
        conn = pubsub_connection(source)
        conn.connect()
        with self._lock:
            if stop.is_set():  # closed while connecting: a later listener owns _conn
                conn.disconnect()
                return None
            self._sent.clear()
            self._acked.clear()
            # A new connection has no subscriptions: channels left meanwhile are just dropped.
            for channel in [c for c, state in self._channels.items() if not state.waiters]:
                del self._channels[channel]
            for channel, state in self._channels.items():
                self._sent[channel] += 1
                state.need = self._sent[channel]
                state.confirmed.clear()
                conn.send_command("SUBSCRIBE", channel)
            self._conn = conn
        return conn

    def _run(self, stop: threading.Event) -> None:
        """The listener's loop, until ``stop`` (the ``_closed`` of the close() that ends it)."""
        delay = RECONNECT_DELAY
        while not stop.is_set():
            conn = None
            try:
                conn = self._connect(stop)
                delay = RECONNECT_DELAY
                while conn is not None and not stop.is_set():
                    self._dispatch(conn.read_response())
            except CONNECTION_ERRORS as exc:
                log.debug("pub/sub connection lost: %s", exc)
            except Exception as exc:
                if stop.is_set():
                    # close() disconnected the socket under the blocked read: redis-py then
                    # fails in ways of its own (its reader is gone). Closing is no error.
                    log.debug("pub/sub listener closed: %r", exc)
                else:  # keep the listener alive whatever happens
                    log.exception("pub/sub listener error")
            with self._lock:
                if conn is not None and self._conn is conn:
                    self._conn = None
                    self._wake_all_locked()
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.disconnect()
            stop.wait(delay)
            delay = min(delay * 2, RECONNECT_DELAY_MAX)

    def _wake_all_locked(self) -> None:
        """The connection is gone: a release may have gone unheard, so every waiter looks
        again now rather than at its hint."""
        for state in self._channels.values():
            for wakeup in state.waiters:
                wakeup.set()

    def _dispatch(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind, channel = reply[0], reply[1]
        if isinstance(channel, str):
            channel = channel.encode()
        if kind in (b"message", "message"):
            with self._lock:
                state = self._channels.get(channel)
                if state is not None:
                    for wakeup in state.waiters:
                        wakeup.set()
        elif kind in (b"subscribe", "subscribe"):
            with self._lock:
                self._acked[channel] += 1
                state = self._channels.get(channel)
                if state is not None and self._acked[channel] >= state.need:
                    state.confirmed.set()

    def leave(self) -> None:
        """One client of this notifier closed; the last one stops the listener."""
        with _registry_lock:
            self._users -= 1
            last = self._users <= 0
        if last:
            self.close()

    def close(self) -> None:
        """Stop the listener and the unsubscriber (tests, clean shutdown). Waiters look once
        more, then fall back to their hints; a waiter that comes later starts both again."""
        with self._lock:
            self._closed.set()
            self._left.put(b"")
            # Taken here, not left for the listener to drop: a waiter that comes meanwhile
            # must not send its SUBSCRIBE on it (redis-py would reconnect it, unread).
            conn, self._conn = self._conn, None
            self._wake_all_locked()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.disconnect()


_notifiers: weakref.WeakKeyDictionary[Any, Notifier] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def notifier_for(redis_client: Any) -> Notifier:
    """The notifier of ``redis_client``'s connection pool in this process, shared by every
    client on that pool (on a Cluster, the client's own); counts one more user of it, for
    :meth:`Notifier.leave`."""
    source = pubsub_source(redis_client)
    with _registry_lock:
        notifier = _notifiers.get(source)
        if notifier is None:
            notifier = _notifiers[source] = Notifier(redis_client)
        notifier._users += 1
        return notifier


def _after_fork_in_child() -> None:
    # The registry's lock may have been held by another thread at the fork.
    global _registry_lock
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
