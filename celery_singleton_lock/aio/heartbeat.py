"""The per-event-loop renewal task: the asyncio counterpart of :mod:`..core.heartbeat`.

One task per event loop renews every async handle of that loop, in one round trip per Redis
client per tick however many handles it holds (the same tick as the thread's:
:mod:`..core.renewal`). The tick period is the shortest lease held divided by
``TICKS_PER_TTL``. A client whose batch is still in flight when the next tick comes is
skipped by that tick, so a Redis that stops answering costs only its own leases. The task
holds weak references only: a handle nobody can reach any more is no longer renewed and runs
out on its own. It ends when nothing is held, and when its loop stops (then every lease of
that loop runs out within its ttl, as for a killed process).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import weakref

import redis

from ..core.renewal import TICKS_PER_TTL, Renewable, RenewalRound, by_connection, tick_period
from ..exceptions import LockBackendError

log = logging.getLogger("celery_singleton_lock.heartbeat")


class AsyncHeartbeat:
    """The registry of one event loop's async handles to renew, and the task renewing them."""

    def __init__(self) -> None:
        self._leases: dict[int, weakref.ReferenceType[Renewable]] = {}
        self._task: asyncio.Task[None] | None = None
        # Made per run of the task: an Event remembers its loop, and this object must not
        # keep a closed loop alive.
        self._wake: asyncio.Event | None = None
        self._period: float | None = None  # what the task is waiting on
        self._in_flight: dict[int, asyncio.Task[None]] = {}
        self.ticks = 0

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task renewing this loop's handles while one runs: from the first handle added
        until nothing is held (None then). Await it (shielded) to know it ended."""
        return self._task

    def add(self, handle: Renewable) -> None:
        """Renew ``handle`` from now on (again, if its ttl changed)."""
        key = id(handle)

        def forget(_: object, key: int = key) -> None:
            self._leases.pop(key, None)

        self._leases[key] = weakref.ref(handle, forget)
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(
                self._run(self._wake), name="celery_singleton_lock-heartbeat"
            )
            self._task.add_done_callback(self._ended)
        elif self._wake is not None and (
            self._period is None or handle.ttl / TICKS_PER_TTL < self._period
        ):
            self._wake.set()

    def remove(self, handle: Renewable) -> None:
        """Stop renewing ``handle`` (released, lost, or past its max-hold)."""
        self._leases.pop(id(handle), None)

    def holds(self, handle: Renewable) -> bool:
        ref = self._leases.get(id(handle))
        return ref is not None and ref() is handle

    def leases(self) -> list[Renewable]:
        """The live handles being renewed."""
        return [h for h in (ref() for ref in list(self._leases.values())) if h is not None]

    def _ended(self, task: asyncio.Task[None]) -> None:
        if self._task is task:
            self._task, self._wake, self._period = None, None, None
        if not task.cancelled() and task.exception() is not None:  # pragma: no cover
            log.error("heartbeat task failed", exc_info=task.exception())

    async def _run(self, wake: asyncio.Event) -> None:
        last_tick = time.monotonic()
        while True:
            period = tick_period(self.leases())
            if period is None:
                return  # add() starts a new task with the next lease
            self._period = period
            timeout = last_tick + period - time.monotonic()
            if timeout > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout)
                if wake.is_set():
                    wake.clear()
                    continue  # a lease came or its ttl changed: recompute the period
            last_tick = time.monotonic()
            try:
                await self._tick(wait=False)
            except Exception:  # never let the renewal task die silently
                log.exception("heartbeat tick failed")

    async def tick(self) -> None:
        """Renew every registered handle of this loop now: one round trip per Redis client,
        the clients concurrently. Returns once every renewal has been applied."""
        await self._tick(wait=True)

    async def _tick(self, *, wait: bool) -> None:
        by_client = by_connection(self.leases())
        self.ticks += 1
        started = []
        for key, handles in by_client.items():
            running = self._in_flight.get(key)
            if running is not None:
                if not wait:
                    continue
                await asyncio.wait([running])
            batch = asyncio.get_running_loop().create_task(self._renew(handles))
            self._in_flight[key] = batch
            batch.add_done_callback(functools.partial(self._landed, key))
            started.append(batch)
        if wait and started:
            await asyncio.gather(*started)

    def _landed(self, key: int, batch: asyncio.Task[None]) -> None:
        if self._in_flight.get(key) is batch:
            del self._in_flight[key]

    async def _renew(self, handles: list[Renewable]) -> None:
        """One round trip: the script calls of every kind batched in a pipeline."""
        renewal = RenewalRound(handles)
        if not renewal.entries:
            return
        conn = renewal.conn
        sent_at = time.monotonic()
        try:
            try:
                replies = await conn.batch(renewal.calls)
            except LockBackendError as exc:
                # redis.asyncio hands out a pooled connection the server has closed (after a
                # restart) and fails on it once, where the sync client reconnects. A renewal
                # only sets the remaining time, so sending it again on a new connection is
                # safe: otherwise a restarted Redis would be noticed a tick late.
                if not isinstance(exc.__cause__, redis.ConnectionError):
                    raise
                sent_at = time.monotonic()
                replies = await conn.batch(renewal.calls)
        except LockBackendError as exc:
            renewal.failed(exc)
            return
        renewal.renewed(replies, sent_at, self.holds)


_heartbeats: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncHeartbeat] = (
    weakref.WeakKeyDictionary()
)


def heartbeat() -> AsyncHeartbeat:
    """The heartbeat of the running event loop."""
    loop = asyncio.get_running_loop()
    found = _heartbeats.get(loop)
    if found is None:
        found = _heartbeats[loop] = AsyncHeartbeat()
    return found
