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

The listener thread only reads; waiters send SUBSCRIBE themselves under a lock. What to
(un)subscribe, when a subscription is live and whom a message wakes is kept by a
:class:`.subscriptions.Subscriptions`, the same as the asyncio listener's.

The last waiter of a channel does not send the UNSUBSCRIBE on its way out of ``acquire``: that
send costs more than the rest of leaving. It marks the channel as left and a second thread,
the unsubscriber, sends it once it gets to run. Until then the subscription stays live: a
waiter that comes back meanwhile keeps it, with no SUBSCRIBE.

On a Redis Cluster whose servers have sharded pub/sub (Redis 7+), the scripts publish a
release with SPUBLISH, which only the node owning the channel's slot (the lock's) delivers,
and a :class:`ClusterNotifier` SSUBSCRIBEs each channel on that node: one connection and
listener per node that has waiters, each a :class:`Notifier` of its own. A channel whose slot
moved (MOVED in reply to SSUBSCRIBE, or an ``sunsubscribe`` the node sends when the slot
leaves it) or whose node's connection was lost is subscribed again on the node that owns it
now, and its waiters look again. A node without SPUBLISH gets plain SUBSCRIBE, as its scripts
fall back to PUBLISH.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import redis

from .forking import reset_in_child
from .redis_urls import is_cluster, pubsub_connection, pubsub_source
from .subscriptions import (
    RECONNECT_DELAY,
    RECONNECT_DELAY_MAX,
    Placement,
    Subscriptions,
)

#: Keeps the module's old name: logging configurations name it (docs/lease.md).
log = logging.getLogger("celery_singleton_lock.waiting")

#: A waiter waits at most this long for Redis to confirm its subscription.
SUBSCRIBE_TIMEOUT = 1.0
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


class Notifier:
    """What wakes the blocked acquirers of the clients on one connection pool: one pub/sub
    connection and listener thread shared by all their waiters in one process (see
    :func:`notifier_for`). The subscription bookkeeping is a :class:`Subscriptions`, used
    under ``_lock``."""

    def __init__(
        self,
        redis_client: Any,
        node_name: str | None = None,
        lost: Callable[[Notifier, list[bytes]], None] | None = None,
    ) -> None:
        #: On a Cluster, the node ("host:port") this listener subscribes on, and what it
        #: tells of channels it no longer listens to there (see :class:`ClusterNotifier`).
        self._node_name = node_name
        self._lost = lost
        # Weak: the registry keeps a notifier only as long as its pool lives (a client
        # made from a URL and dropped unclosed takes its pool with it).
        self._source = weakref.ref(pubsub_source(redis_client))
        #: The clients using it that have not closed (the last one to close stops it).
        self._users = 0
        self._reset_after_fork()
        reset_in_child(self)

    def _reset_after_fork(self) -> None:
        # Also the initial state: the child has no listener thread and must not read the
        # parent's socket.
        self._lock = threading.Lock()
        self.subscriptions: Subscriptions[QueueWakeup, threading.Event] = Subscriptions(
            threading.Event
        )
        self._conn: Any = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        #: Channels whose last waiter left, for the unsubscriber (a C queue: putting one in
        #: neither drops the GIL nor takes a Python-level lock, unlike an Event).
        self._left: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._unsubscriber: threading.Thread | None = None

    @property
    def connection(self) -> Any:
        """The pub/sub connection the listener reads (None while it is not connected)."""
        return self._conn

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        """The listener's threads alive now: the one reading the pub/sub connection and the
        one unsubscribing the channels waiters left. The first waiter starts them and
        :meth:`close` stops them without waiting for them: join these to know they ended."""
        with self._lock:
            threads = (self._thread, self._unsubscriber)
        return tuple(thread for thread in threads if thread is not None and thread.is_alive())

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
            wait_confirmed(confirmed)
            yield wakeup
        finally:
            for channel in channels:
                self._remove(channel, wakeup)

    def _add(self, channel: bytes, wakeup: QueueWakeup) -> threading.Event:
        with self._lock:
            self._ensure_threads()
            confirmed, new = self.subscriptions.join(channel, wakeup)
            if new:
                self._send_locked("SUBSCRIBE", channel)
            return confirmed

    def _remove(self, channel: bytes, wakeup: QueueWakeup) -> bool:
        """``wakeup`` leaves ``channel``; whether other waiters are left on it."""
        with self._lock:
            if self.subscriptions.leave(channel, wakeup):
                return True
            left = self._left
        left.put(channel)
        return False

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
            for channel in self.subscriptions.unsubscribable(channels):
                self._send_locked("UNSUBSCRIBE", channel)

    def _send_locked(self, command: str, channel: bytes) -> None:
        if self._conn is None:
            return  # the listener subscribes every live channel when it reconnects
        try:
            self._conn.send_command(self.subscriptions.command(command, channel), channel)
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
        conn = pubsub_connection(source, self._node_name)
        conn.connect()
        sharded = self._node_name is not None and has_sharded_pubsub(conn)
        with self._lock:
            if stop.is_set():  # closed while connecting: a later listener owns _conn
                conn.disconnect()
                return None
            subscribe, channels = self.subscriptions.reconnected(sharded)
            for channel in channels:
                conn.send_command(subscribe, channel)
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
                    try:
                        reply = conn.read_response()
                    except redis.ResponseError as exc:
                        self._refused(exc)
                    else:
                        with self._lock:
                            moved = self.subscriptions.dispatch(reply)
                        if moved:
                            self._hand_back(moved)
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
                    self.subscriptions.wake_all()
                waited = self.subscriptions.waited()
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.disconnect()
            if self._lost is not None and not stop.is_set():
                # The node may be gone for good (a failover): its channels go to whichever
                # node owns them now, which may be this one again.
                if waited:
                    self._hand_back(waited)
                with self._lock:
                    if not self.subscriptions:  # none left here: no reconnecting in vain
                        self._thread = None
                        return
            stop.wait(delay)
            delay = min(delay * 2, RECONNECT_DELAY_MAX)

    def _refused(self, exc: redis.ResponseError) -> None:
        """An SSUBSCRIBE refused: with MOVED (or ASK), its channel's slot is on another
        node now, and the channels of that slot go there."""
        source = self._source() if self._lost is not None else None
        with self._lock:
            channels = self.subscriptions.refused(exc, None if source is None else source.keyslot)
        if channels:
            self._hand_back(channels)

    def _hand_back(self, channels: list[bytes]) -> None:
        """Tell the cluster notifier this listener no longer listens to ``channels``."""
        if self._lost is None:
            return
        try:
            self._lost(self, channels)
        except Exception:  # the cluster is unreachable: the waiters fall back to their hints
            log.debug("pub/sub channels not moved", exc_info=True)

    def take(self, channel: bytes) -> set[QueueWakeup]:
        """Stop listening to ``channel`` here, no longer subscribed (its slot moved, or the
        connection is gone); its waiters, for another node's listener."""
        with self._lock:
            return self.subscriptions.take(channel)

    def listens_to(self, channel: bytes) -> bool:
        """Whether ``channel`` is subscribed here (or about to be)."""
        with self._lock:
            return self.subscriptions.listens_to(channel)

    def leave(self) -> None:
        """One client of this notifier closed; the last one stops the listener."""
        if _last_user(self):
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
            self.subscriptions.wake_all()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.disconnect()


def wait_confirmed(confirmed: list[threading.Event]) -> None:
    """Until every subscription of ``confirmed`` is live, or ``SUBSCRIBE_TIMEOUT`` passed."""
    deadline = time.monotonic() + SUBSCRIBE_TIMEOUT
    for done in confirmed:
        done.wait(max(0.0, deadline - time.monotonic()))


def has_sharded_pubsub(conn: Any) -> bool:
    """Whether the server on ``conn`` (connected, nothing subscribed yet) has SPUBLISH."""
    conn.send_command("COMMAND", "INFO", "SPUBLISH")
    reply = conn.read_response()
    return bool(reply and reply[0])


class ClusterNotifier:
    """:class:`Notifier` on a Redis Cluster: a listener per node that has waiters, each
    channel subscribed on the node owning its slot (see the module's docstring)."""

    def __init__(self, redis_client: Any) -> None:
        self._source = weakref.ref(redis_client)
        self._users = 0
        self._reset_after_fork()
        reset_in_child(self)

    def _reset_after_fork(self) -> None:
        self._lock = threading.Lock()
        self.placement: Placement[Notifier] = Placement()

    def _listener_locked(self, channel: bytes) -> Notifier:
        """The listener ``channel`` is subscribed with, or that of its slot's node."""
        listener = self.placement.current(channel)
        if listener is not None:
            return listener
        source = self._source()
        if source is None:
            raise redis.ConnectionError("the Redis Cluster client is gone")
        node = source.get_node_from_key(channel).name
        return self.placement.place(channel, node, lambda name: Notifier(source, name, self._moved))

    @contextmanager
    def listening(self, *channels: bytes) -> Iterator[QueueWakeup]:
        """As :meth:`Notifier.listening`, each channel on its slot's node."""
        wakeup = QueueWakeup()
        try:
            with self._lock:
                confirmed = [self._listener_locked(c)._add(c, wakeup) for c in channels]
            wait_confirmed(confirmed)
            yield wakeup
        finally:
            with self._lock:
                self.placement.leave(channels, wakeup)

    def _moved(self, old: Notifier, channels: list[bytes]) -> None:
        """``old`` no longer listens to ``channels``: subscribe them where their slots are
        now; their waiters look again (a release may have gone unseen meanwhile)."""
        source = self._source()
        if source is None:
            return
        for channel in channels:
            # redis-py follows the MOVED this gets and learns the slot's owner.
            with contextlib.suppress(redis.RedisError, redis.exceptions.RedisClusterException):
                source.exists(channel)
        woken: list[QueueWakeup] = []
        with self._lock:
            for channel in channels:
                waiters = self.placement.take(old, channel)
                if not waiters:
                    continue
                listener = self._listener_locked(channel)
                for wakeup in waiters:
                    listener._add(channel, wakeup)
                woken += waiters
        for wakeup in woken:
            wakeup.set()

    def leave(self) -> None:
        """One client of this notifier closed; the last one stops the listeners."""
        if _last_user(self):
            self.close()

    def close(self) -> None:
        """Stop every node's listener (see :meth:`Notifier.close`)."""
        with self._lock:
            listeners = list(self.placement.nodes.values())
        for listener in listeners:
            listener.close()


_notifiers: weakref.WeakKeyDictionary[Any, Notifier | ClusterNotifier] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def notifier_for(redis_client: Any) -> Notifier | ClusterNotifier:
    """The notifier of ``redis_client``'s connection pool in this process, shared by every
    client on that pool (on a Cluster, the client's own); counts one more user of it, for
    :meth:`Notifier.leave`."""
    source = pubsub_source(redis_client)
    with _registry_lock:
        notifier = _notifiers.get(source)
        if notifier is None:
            made = ClusterNotifier if is_cluster(redis_client) else Notifier
            notifier = _notifiers[source] = made(redis_client)
        notifier._users += 1
        return notifier


def _last_user(notifier: Notifier | ClusterNotifier) -> bool:
    """One user of ``notifier`` closed: whether it was the last."""
    with _registry_lock:
        notifier._users -= 1
        return notifier._users <= 0


def _after_fork_in_child() -> None:
    # The registry's lock may have been held by another thread at the fork.
    global _registry_lock
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
