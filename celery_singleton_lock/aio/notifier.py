"""How blocked async acquirers are woken: one pub/sub listener task per client and event loop.

The same protocol as the threads' :mod:`..core.notifier`, kept by the same
:class:`..core.subscriptions.Subscriptions`: a waiter subscribes to its lock's channel, waits
until Redis confirms the subscription, tries the lock once more (a release that came before
the subscription is not missed), then sleeps until a release is published or until the
script's hint says the holder could have run out. The listener task only reads; waiters send
SUBSCRIBE themselves.

Two things keep a woken waiter's way back to its caller short (a hand-off's latency):

- it sleeps on a :class:`Wakeup`, a future the listener completes from its dispatch, not on
  ``asyncio.wait_for`` of an Event's ``wait()`` (a task of its own per sleep, and a loop
  iteration more between the message and the retry);
- the last waiter of a channel leaves without sending the ``UNSUBSCRIBE``: a task of the
  notifier sends it once the waiter has returned, unless a waiter came back to the channel
  meanwhile, which then finds its subscription still live and sends no ``SUBSCRIBE``.

On a Redis Cluster, as the threads' :class:`..core.notifier.ClusterNotifier`: an
:class:`AsyncClusterNotifier` SSUBSCRIBEs each channel on the node owning its slot, with a
listener per node that has waiters, and moves a channel whose slot moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import redis

from ..core.notifier import CONNECTION_ERRORS, SUBSCRIBE_TIMEOUT
from ..core.redis_urls import is_async_cluster, pubsub_connection_of
from ..core.subscriptions import (
    RECONNECT_DELAY,
    RECONNECT_DELAY_MAX,
    Placement,
    Subscriptions,
)

log = logging.getLogger("celery_singleton_lock.waiting")


class Wakeup:
    """What one waiter sleeps on: set by each message on its channels, and when the
    connection drops (a release may have gone unseen)."""

    __slots__ = ("_future", "_set")

    def __init__(self) -> None:
        self._set = False
        self._future: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until set or ``timeout`` seconds pass, whichever comes first; then cleared. A set
        that came while the waiter was not sleeping (its attempt was under way) returns at
        once: that release may have come after the attempt read the lock."""
        if not self._set:
            loop = asyncio.get_running_loop()
            future = self._future = loop.create_future()
            timer = loop.call_later(timeout, _complete, future)
            try:
                await future
            finally:
                timer.cancel()
                self._future = None
        self._set = False


def _complete(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class AsyncNotifier:
    """Shared by every waiter of one :class:`AsyncLockClient` on one event loop. The
    subscription bookkeeping is a :class:`Subscriptions`, as for the threads' notifier."""

    def __init__(
        self,
        redis_client: Any,
        node_name: str | None = None,
        lost: Callable[[AsyncNotifier, list[bytes]], None] | None = None,
    ) -> None:
        self._redis = redis_client
        #: On a Cluster, the node this listener subscribes on, and what it tells of channels
        #: it no longer listens to there (see :class:`AsyncClusterNotifier`).
        self._node_name = node_name
        self._lost = lost
        self.subscriptions: Subscriptions[Wakeup, asyncio.Event] = Subscriptions(asyncio.Event)
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        #: Channels whose last waiter left; the unsubscriber task sends their UNSUBSCRIBE.
        self._idle: set[bytes] = set()
        self._unsubscriber: asyncio.Task[None] | None = None

    @asynccontextmanager
    async def listening(self, channels: Sequence[bytes]) -> AsyncIterator[Wakeup]:
        """Subscribed to ``channels`` for the duration of the block; yields a
        :class:`Wakeup` set by each message on any of them (and when the connection drops,
        so waiters look again). On entry the subscriptions are confirmed, or
        ``SUBSCRIBE_TIMEOUT`` passed and the waiter falls back to its hint."""
        wakeup = Wakeup()
        try:
            await wait_confirmed([await self._add(channel, wakeup) for channel in channels])
            yield wakeup
        finally:
            for channel in channels:
                self._remove(channel, wakeup)

    async def _add(self, channel: bytes, wakeup: Wakeup) -> asyncio.Event:
        self._ensure_listener()
        confirmed, new = self.subscriptions.join(channel, wakeup)
        if new:
            await self._send("SUBSCRIBE", channel)
        return confirmed

    def _remove(self, channel: bytes, wakeup: Wakeup) -> bool:
        """``wakeup`` leaves ``channel``; whether other waiters are left on it."""
        if self.subscriptions.leave(channel, wakeup):
            return True
        self._idle.add(channel)
        if self._unsubscriber is None or self._unsubscriber.done():
            self._unsubscriber = asyncio.get_running_loop().create_task(
                self._unsubscribe_idle(), name="celery_singleton_lock-unsubscribe"
            )
        return False

    async def _unsubscribe_idle(self) -> None:
        """UNSUBSCRIBE each channel that still has no waiter (one that does was come back
        to, and stays subscribed)."""
        while self._idle:
            for channel in self.subscriptions.unsubscribable([self._idle.pop()]):
                await self._send("UNSUBSCRIBE", channel)

    async def _send(self, command: str, channel: bytes) -> None:
        conn = self._conn
        if conn is None:
            return  # the listener subscribes every live channel when it (re)connects
        command = self.subscriptions.command(command, channel)
        try:
            await conn.send_command(command, channel, check_health=False)
        except CONNECTION_ERRORS:
            log.debug("pub/sub send failed; the listener will reconnect", exc_info=True)

    def _ensure_listener(self) -> None:
        if self._task is not None and not self._task.done():
            return
        self._closed = False
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="celery_singleton_lock-waiting"
        )
        self._task.add_done_callback(self._ended)

    async def _connection_source(self) -> Any:
        """What the pub/sub connection is made from: the client's pool, or on a Redis Cluster
        this listener's node."""
        if not is_async_cluster(self._redis):
            return self._redis.connection_pool
        await self._redis.initialize()  # learns the nodes on first use; no I/O once it has
        node = self._redis.get_node(node_name=self._node_name)
        if node is None:  # no longer in the client's map: the listener looks again
            raise redis.ConnectionError(f"no cluster node {self._node_name}")
        return node

    def _ended(self, task: asyncio.Task[None]) -> None:
        # A finished task still names its loop: drop it, so a stopped loop can be collected.
        if self._task is task:
            self._task = None

    async def _connect(self) -> Any:
        conn = pubsub_connection_of(await self._connection_source())
        await conn.connect()
        sharded = False
        if self._node_name is not None:
            await conn.send_command("COMMAND", "INFO", "SPUBLISH", check_health=False)
            reply = await conn.read_response()
            sharded = bool(reply and reply[0])
        subscribe, channels = self.subscriptions.reconnected(sharded)
        # Published before any waiter's own send can reach it: replies stay in order.
        self._conn = conn
        for channel in channels:
            await conn.send_command(subscribe, channel, check_health=False)
        return conn

    async def _run(self) -> None:
        delay = RECONNECT_DELAY
        while not self._closed:
            try:
                conn = await self._connect()
                delay = RECONNECT_DELAY
                while not self._closed:
                    try:
                        reply = await conn.read_response()
                    except redis.ResponseError as exc:
                        self._refused(exc)
                    else:
                        moved = self.subscriptions.dispatch(reply)
                        if moved and self._lost is not None:
                            self._lost(self, moved)
            except CONNECTION_ERRORS as exc:
                log.debug("pub/sub connection lost: %s", exc)
            except asyncio.CancelledError:
                await self._drop()
                raise
            except Exception:  # pragma: no cover - keep the listener alive whatever happens
                log.exception("pub/sub listener error")
            await self._drop()
            # Waiters look again now rather than at their hint: a release may be unseen.
            self.subscriptions.wake_all()
            if self._closed:
                break
            if self._lost is not None:
                # The node may be gone for good (a failover): its channels go to whichever
                # node owns them now, which may be this one again.
                waited = self.subscriptions.waited()
                if waited:
                    self._lost(self, waited)
                if not self.subscriptions:  # none left here: no reconnecting in vain
                    break
            await asyncio.sleep(delay)  # reconnect back-off, not a poll of the lock
            delay = min(delay * 2, RECONNECT_DELAY_MAX)

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.disconnect()

    def _refused(self, exc: redis.ResponseError) -> None:
        """An SSUBSCRIBE refused: with MOVED (or ASK), the channels of that slot go to the
        node that has it now."""
        lost = self._lost
        channels = self.subscriptions.refused(exc, None if lost is None else self._redis.keyslot)
        if channels and lost is not None:
            lost(self, channels)

    def take(self, channel: bytes) -> set[Wakeup]:
        """Stop listening to ``channel`` here, no longer subscribed; its waiters, for
        another node's listener."""
        return self.subscriptions.take(channel)

    def listens_to(self, channel: bytes) -> bool:
        """Whether ``channel`` is subscribed here (or about to be)."""
        return self.subscriptions.listens_to(channel)

    async def close(self) -> None:
        """Stop the listener; waiters fall back to their hints."""
        self._closed = True
        for task in (self._task, self._unsubscriber):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._task = self._unsubscriber = None
        self._idle.clear()
        await self._drop()


async def wait_confirmed(confirmed: list[asyncio.Event]) -> None:
    """Until every subscription of ``confirmed`` is live, or ``SUBSCRIBE_TIMEOUT`` passed."""
    pending = [asyncio.ensure_future(done.wait()) for done in confirmed if not done.is_set()]
    if pending:
        try:
            await asyncio.wait(pending, timeout=SUBSCRIBE_TIMEOUT)
        finally:
            for waiting in pending:  # timed out, or this task was cancelled
                waiting.cancel()


class AsyncClusterNotifier:
    """:class:`AsyncNotifier` on a Redis Cluster: a listener per node that has waiters, each
    channel subscribed on the node owning its slot."""

    def __init__(self, redis_client: Any) -> None:
        self._redis = redis_client
        self.placement: Placement[AsyncNotifier] = Placement()
        #: The tasks moving channels whose slot moved (kept until done).
        self._moving: set[asyncio.Task[None]] = set()

    async def _listener(self, channel: bytes) -> AsyncNotifier:
        """The listener ``channel`` is subscribed with, or that of its slot's node."""
        listener = self.placement.current(channel)
        if listener is not None:
            return listener
        await self._redis.initialize()  # learns the nodes on first use
        node = self._redis.get_node_from_key(channel).name
        return self.placement.place(
            channel, node, lambda name: AsyncNotifier(self._redis, name, self._moved)
        )

    @asynccontextmanager
    async def listening(self, channels: Sequence[bytes]) -> AsyncIterator[Wakeup]:
        """As :meth:`AsyncNotifier.listening`, each channel on its slot's node."""
        wakeup = Wakeup()
        try:
            confirmed = [await (await self._listener(c))._add(c, wakeup) for c in channels]
            await wait_confirmed(confirmed)
            yield wakeup
        finally:
            self.placement.leave(channels, wakeup)

    def _moved(self, old: AsyncNotifier, channels: list[bytes]) -> None:
        """``old`` no longer listens to ``channels`` (called from its dispatch)."""
        task = asyncio.get_running_loop().create_task(self._move(old, channels))
        self._moving.add(task)
        task.add_done_callback(self._moving.discard)

    async def _move(self, old: AsyncNotifier, channels: list[bytes]) -> None:
        """Subscribe ``channels`` where their slots are now; their waiters look again."""
        woken: list[Wakeup] = []
        for channel in channels:
            waiters = self.placement.take(old, channel)
            if not waiters:
                continue
            # The client follows the MOVED this gets and learns the slot's owner.
            with contextlib.suppress(redis.RedisError, redis.exceptions.RedisClusterException):
                await self._redis.exists(channel)
            try:
                listener = await self._listener(channel)
            except Exception:  # the cluster is unreachable: the waiters fall to their hints
                log.debug("no node for channel %r", channel, exc_info=True)
                woken += waiters
                continue
            for wakeup in waiters:
                await listener._add(channel, wakeup)
            woken += waiters
        for wakeup in woken:
            wakeup.set()

    async def close(self) -> None:
        """Stop every node's listener."""
        for task in list(self._moving):
            task.cancel()
        for listener in list(self.placement.nodes.values()):
            await listener.close()


def async_notifier(redis_client: Any) -> AsyncNotifier | AsyncClusterNotifier:
    """The notifier for one client and event loop: per node on a Redis Cluster."""
    if is_async_cluster(redis_client):
        return AsyncClusterNotifier(redis_client)
    return AsyncNotifier(redis_client)
