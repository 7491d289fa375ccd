"""How blocked async acquirers are woken: one pub/sub listener task per client and event loop.

The same protocol as the threads' :mod:`..waiting`: a waiter subscribes to its lock's
channel, waits until Redis confirms the subscription, tries the lock once more (a release
that came before the subscription is not missed), then sleeps until a release is published
or until the script's hint says the holder could have run out. The listener task only reads;
waiters send SUBSCRIBE/UNSUBSCRIBE themselves, and counting ``subscribe`` acknowledgements per
channel tells each waiter when *its* subscription is live.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from ..core.notifier import RECONNECT_DELAY, RECONNECT_DELAY_MAX
from ..core.redis_urls import pubsub_connection_of
from ..core.subscriber import CONNECTION_ERRORS, SUBSCRIBE_TIMEOUT

log = logging.getLogger("celery_singleton_lock.waiting")


class _Channel:
    __slots__ = ("confirmed", "need", "waiters")

    def __init__(self) -> None:
        self.waiters: set[asyncio.Event] = set()
        self.confirmed = asyncio.Event()
        self.need = 0


class AsyncNotifier:
    """Shared by every waiter of one :class:`AsyncLockClient` on one event loop."""

    def __init__(self, redis_client: Any) -> None:
        self._redis = redis_client
        self._channels: dict[bytes, _Channel] = {}
        self._sent: Counter[bytes] = Counter()
        self._acked: Counter[bytes] = Counter()
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @asynccontextmanager
    async def listening(self, channels: Sequence[bytes]) -> AsyncIterator[asyncio.Event]:
        """Subscribed to ``channels`` for the duration of the block; yields an Event set by
        each message on any of them (and when the connection drops, so waiters look again).
        On entry the subscriptions are confirmed, or ``SUBSCRIBE_TIMEOUT`` passed and the
        waiter falls back to its hint."""
        event = asyncio.Event()
        try:
            confirmed = [await self._add(channel, event) for channel in channels]
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*(done.wait() for done in confirmed)), SUBSCRIBE_TIMEOUT
                )
            yield event
        finally:
            for channel in channels:
                await self._remove(channel, event)

    async def _add(self, channel: bytes, event: asyncio.Event) -> asyncio.Event:
        self._ensure_listener()
        state = self._channels.get(channel)
        if state is None:
            state = self._channels[channel] = _Channel()
            self._sent[channel] += 1
            state.need = self._sent[channel]
            if self._acked[channel] >= state.need:
                state.confirmed.set()
            await self._send("SUBSCRIBE", channel)
        state.waiters.add(event)
        return state.confirmed

    async def _remove(self, channel: bytes, event: asyncio.Event) -> None:
        state = self._channels.get(channel)
        if state is None:
            return
        state.waiters.discard(event)
        if not state.waiters:
            del self._channels[channel]
            await self._send("UNSUBSCRIBE", channel)

    async def _send(self, command: str, channel: bytes) -> None:
        conn = self._conn
        if conn is None:
            return  # the listener subscribes every live channel when it (re)connects
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

    def _ended(self, task: asyncio.Task[None]) -> None:
        # A finished task still names its loop: drop it, so a stopped loop can be collected.
        if self._task is task:
            self._task = None

    async def _connect(self) -> Any:
        conn = pubsub_connection_of(self._redis.connection_pool)
        await conn.connect()
        self._sent.clear()
        self._acked.clear()
        channels = list(self._channels.items())
        for channel, state in channels:
            self._sent[channel] += 1
            state.need = self._sent[channel]
            state.confirmed.clear()
        # Published before any waiter's own send can reach it: replies stay in order.
        self._conn = conn
        for channel, _ in channels:
            await conn.send_command("SUBSCRIBE", channel, check_health=False)
        return conn

    async def _run(self) -> None:
        delay = RECONNECT_DELAY
        while not self._closed:
            try:
                conn = await self._connect()
                delay = RECONNECT_DELAY
                while not self._closed:
                    self._dispatch(await conn.read_response())
            except CONNECTION_ERRORS as exc:
                log.debug("pub/sub connection lost: %s", exc)
            except asyncio.CancelledError:
                await self._drop()
                raise
            except Exception:  # pragma: no cover - keep the listener alive whatever happens
                log.exception("pub/sub listener error")
            await self._drop()
            # Waiters look again now rather than at their hint: a release may be unseen.
            for state in self._channels.values():
                for event in state.waiters:
                    event.set()
            if self._closed:
                break
            await asyncio.sleep(delay)  # reconnect back-off, not a poll of the lock
            delay = min(delay * 2, RECONNECT_DELAY_MAX)

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.disconnect()

    def _dispatch(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind, channel = reply[0], reply[1]
        if isinstance(channel, str):
            channel = channel.encode()
        if kind in (b"message", "message"):
            state = self._channels.get(channel)
            if state is not None:
                for event in state.waiters:
                    event.set()
        elif kind in (b"subscribe", "subscribe"):
            self._acked[channel] += 1
            state = self._channels.get(channel)
            if state is not None and self._acked[channel] >= state.need:
                state.confirmed.set()

    async def close(self) -> None:
        """Stop the listener; waiters fall back to their hints."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._drop()
