"""How blocked acquirers are woken: one pub/sub connection per Redis client per process.

A waiter subscribes to its lock's channel, waits until Redis confirms the subscription, tries
the lock once more (closing the race with a release that came before the subscription), then
sleeps until a release is published or until the holder's lease would run out (the hint the
acquire script returns), whichever comes first. A lost message therefore costs at most the
hint, never a missed lock; there is no polling loop.

The listener thread only reads; waiters send SUBSCRIBE/UNSUBSCRIBE themselves under a lock.
Replies arrive in the order commands were sent, so counting ``subscribe`` acknowledgements per
channel tells each waiter when *its* subscription is live.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from .redis_urls import pubsub_pool

#: Keeps the module's old name: logging configurations name it (docs/lease.md).
log = logging.getLogger("celery_singleton_lock.waiting")

#: How long the listener waits before reconnecting after Redis went away (doubles to 2 s).
RECONNECT_DELAY = 0.05
RECONNECT_DELAY_MAX = 2.0
#: A waiter waits at most this long for Redis to confirm its subscription.
SUBSCRIBE_TIMEOUT = 1.0


class _Channel:
    __slots__ = ("confirmed", "need", "waiters")

    def __init__(self) -> None:
        self.waiters: set[threading.Event] = set()
        self.confirmed = threading.Event()
        self.need = 0


class Notifier:
    """Shared by every waiter of one :class:`LockClient` in one process."""

    def __init__(self, redis_client: Any) -> None:
        self._redis = redis_client
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._channels: dict[bytes, _Channel] = {}
        self._sent: Counter[bytes] = Counter()
        self._acked: Counter[bytes] = Counter()
        self._conn: Any = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        _live_notifiers.add(self)

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

    @contextmanager
    def listening(self, channel: bytes) -> Iterator[threading.Event]:
        """Subscribe to ``channel`` for the duration of the block.

        Yields an Event that is set by each message on the channel (and when the connection
        drops, so that waiters look again). On entry the subscription is confirmed, or
        ``SUBSCRIBE_TIMEOUT`` passed and the waiter falls back to its hint.
        """
        event = threading.Event()
        confirmed = self._add(channel, event)
        confirmed.wait(SUBSCRIBE_TIMEOUT)
        try:
            yield event
        finally:
            self._remove(channel, event)

    def _add(self, channel: bytes, event: threading.Event) -> threading.Event:
        with self._lock:
            self._ensure_listener()
            state = self._channels.get(channel)
            if state is None:
                state = self._channels[channel] = _Channel()
                self._send_locked("SUBSCRIBE", channel)
                state.need = self._sent[channel]
                if self._acked[channel] >= state.need:
                    state.confirmed.set()
            state.waiters.add(event)
            return state.confirmed

    def _remove(self, channel: bytes, event: threading.Event) -> None:
        with self._lock:
            state = self._channels.get(channel)
            if state is None:
                return
            state.waiters.discard(event)
            if not state.waiters:
                del self._channels[channel]
                self._send_locked("UNSUBSCRIBE", channel, count=False)

    def _send_locked(self, command: str, channel: bytes, *, count: bool = True) -> None:
        if count:
            self._sent[channel] += 1
        if self._conn is None:
            return  # the listener subscribes every live channel when it reconnects
        try:
            self._conn.send_command(command, channel)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            log.debug("pub/sub send failed; the listener will reconnect", exc_info=True)

    def _ensure_listener(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._closed.clear()
        self._thread = threading.Thread(
            target=self._run, name="celery_singleton_lock-waiting", daemon=True
        )
        self._thread.start()

    def _connect(self) -> Any:
        pool = pubsub_pool(self._redis)  # on a Cluster: any node, PUBLISH reaches all
        kwargs = dict(pool.connection_kwargs)
        # The listener blocks on read indefinitely; a client socket timeout would break it.
        kwargs["socket_timeout"] = None
        # RESP2 keeps pub/sub replies plain arrays. redis-py 8 defaults to RESP3 and would
        # then insist on maintenance notifications, which RESP2 without hiredis cannot carry.
        kwargs["protocol"] = 2
        if "maint_notifications_config" in kwargs:
            kwargs["maint_notifications_config"] = None
        conn = pool.connection_class(**kwargs)
        conn.connect()
        with self._lock:
            self._sent.clear()
            self._acked.clear()
            for channel, state in self._channels.items():
                self._sent[channel] += 1
                state.need = self._sent[channel]
                state.confirmed.clear()
                conn.send_command("SUBSCRIBE", channel)
            self._conn = conn
        return conn

    def _run(self) -> None:
        delay = RECONNECT_DELAY
        while not self._closed.is_set():
            try:
                conn = self._connect()
                delay = RECONNECT_DELAY
                while not self._closed.is_set():
                    self._dispatch(conn.read_response())
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                log.debug("pub/sub connection lost: %s", exc)
            except Exception as exc:
                if self._closed.is_set():
                    # close() disconnected the socket under the blocked read: redis-py then
                    # fails in ways of its own (its reader is gone). Closing is no error.
                    log.debug("pub/sub listener closed: %r", exc)
                else:  # keep the listener alive whatever happens
                    log.exception("pub/sub listener error")
            with self._lock:
                conn, self._conn = self._conn, None
                # Waiters look again now rather than at their hint: a release may be unseen.
                for state in self._channels.values():
                    for event in state.waiters:
                        event.set()
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.disconnect()
            self._closed.wait(delay)
            delay = min(delay * 2, RECONNECT_DELAY_MAX)

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
                    for event in state.waiters:
                        event.set()
        elif kind in (b"subscribe", "subscribe"):
            with self._lock:
                self._acked[channel] += 1
                state = self._channels.get(channel)
                if state is not None and self._acked[channel] >= state.need:
                    state.confirmed.set()

    def close(self) -> None:
        """Stop the listener (tests, clean shutdown). Waiters fall back to their hints."""
        self._closed.set()
        with self._lock:
            conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.disconnect()


_live_notifiers: weakref.WeakSet[Notifier] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for notifier in list(_live_notifiers):
        notifier._reset_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
