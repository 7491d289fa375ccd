"""The asyncio lock handle: the driver of :class:`..core.handle_state.HandleState` (held,
lost, check, the lost-lock bookkeeping, the waiter's sleeps, shared with the sync handle)
with awaitable round trips.

A subclass supplies them: ``_try_acquire(owner, reserve)``, ``_release(owner, delay_ms)``
and the classmethod ``_renew_script_call(conn, entries)`` the heartbeat batches. A handle
works through an :class:`AsyncConnection` (given one, or an ``AsyncLockClient``), and
belongs to the event loop that acquired it: its loop's heartbeat task renews it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

from ..core.handle_state import (
    NO_LOCK,
    HandleState,
    Outage,
    _Process,
    check_options,
    retry_in,
)
from ..core.heartbeat import RenewUnit, renew_calls
from ..core.holder import holder_fields
from ..core.scripts import ScriptCall
from ..exceptions import LockBackendError, LockLost
from .connection import AsyncConnection, HasAsyncConnection, async_connection_of
from .heartbeat import AsyncHeartbeat, heartbeat

log = logging.getLogger("celery_singleton_lock.lease")

H = TypeVar("H", bound="AsyncLockHandle")

#: (handle, owner token, ttl ms, generation): one renewal the subclass turns into script
#: arguments.
RenewEntry = tuple[Any, str, int, int]

#: Callbacks run when a handle is found lost that are still running (a task nobody else
#: holds a reference to could be collected half-way).
_callbacks: set[asyncio.Task[Any]] = set()


class AsyncLockHandle(HandleState):
    """Base of every async lock handle (lease, read/upgradable/write, range, multi).

    Made by the factories of :class:`AsyncLockClient`. ``await acquire()`` takes the lock,
    ``await release()`` gives it back, and while it is held the event loop's heartbeat task
    renews it every ``ttl / TICKS_PER_TTL`` seconds, so a holder whose loop stops frees it
    within ``ttl``. ``async with`` acquires (waiting up to ``wait`` seconds, else raising
    :class:`LockTimeout`) and releases on exit.

    The state and its decisions are :class:`HandleState`'s, as for the sync handle; this
    class awaits the round trips and the waits. ``on_lost`` is called with the handle from
    the heartbeat task or the code whose check() or extend() found the lock lost; a
    coroutine function's result is run as a task of the handle's loop.
    """

    __slots__ = ("_conn", "_beat")

    _stall_causes = "event loop blocked or stopped, Redis unreachable or max_hold reached"
    #: Every state change runs on the handle's event loop: no lock needed.
    _state = NO_LOCK

    def __init__(
        self,
        client: AsyncConnection | HasAsyncConnection,
        name: str,
        *,
        ttl: float = 30.0,
        heartbeat: bool = True,
        max_hold: float | None = None,
        wait: float = 0.0,
        owner_info: dict[str, Any] | None = None,
        on_lost: Callable[[Any], object] | None = None,
    ) -> None:
        self._configure(check_options(name, ttl, heartbeat, max_hold, wait, owner_info, on_lost))
        self._conn = async_connection_of(client)
        self._beat: AsyncHeartbeat | None = None

    # -- what a subclass provides ------------------------------------------------------------

    #: The pub/sub channels releases of this lock are published on.
    _channels: tuple[bytes, ...]

    async def _try_acquire(self, owner: str, reserve: bool) -> tuple[bool, int]:
        """One acquire round trip: (True, token) or (False, ms a waiter may sleep)."""
        raise NotImplementedError

    async def _abandon(self, owner: str) -> None:
        """The caller stopped waiting: drop whatever ``_try_acquire`` reserved."""

    async def _release(self, owner: str, delay_ms: int) -> int:
        """One release round trip: a ``HolderReply`` (DONE, GONE or TAKEN)."""
        raise NotImplementedError

    @classmethod
    def _renew_script_call(cls, conn: AsyncConnection, entries: list[RenewEntry]) -> ScriptCall:
        """One script call renewing ``entries``; its reply has one code per entry."""
        raise NotImplementedError

    def _renew_units(self, owner: str, ttl_ms: int, gen: int) -> list[RenewUnit]:
        """On a Redis Cluster, this handle's renewal in units of one slot each, as the sync
        handles' (core/handle.py): by default the whole handle, in its channel's slot."""
        renewer: Any = type(self)._renew_script_call  # takes an AsyncConnection
        return [(renewer, self._channels[0], (self, owner, ttl_ms, gen))]

    # -- acquire / release / extend ----------------------------------------------------------

    async def acquire(self, wait: float | None = None) -> bool:
        """Take the lock; True if taken, False if ``wait`` seconds passed first.

        ``wait`` defaults to the handle's own; ``math.inf`` waits forever. A blocked call is
        woken by a release (pub/sub), or when a conflicting holder's lease could have run out.
        """
        wait, owner = self._begin_acquire(wait)
        # redis-py can lose a cancellation that lands while a command is under way (the
        # call returns its reply instead): one asked for during this acquire is raised
        # after each attempt, where the acquire undoes what its attempts did. The count
        # of cancellations asked for is Python 3.11's; before it, none is noticed.
        cancelling = getattr(asyncio.current_task(), "cancelling", None)
        cancels = cancelling() if cancelling is not None else 0

        def cancelled_meanwhile() -> bool:
            return cancelling is not None and cancelling() > cancels

        def raise_if_cancelled() -> None:
            if cancelled_meanwhile():
                raise asyncio.CancelledError

        sent_at = time.monotonic()
        try:
            taken, value = await self._try_acquire(owner, wait > 0)
            raise_if_cancelled()
            if not taken:
                if wait <= 0:
                    return False

                async def attempt() -> tuple[bool, int]:
                    nonlocal sent_at
                    sent_at = time.monotonic()
                    result = await self._try_acquire(owner, True)
                    raise_if_cancelled()
                    return result

                taken, value = await self._wait_for(attempt, wait, lambda: self._abandon(owner))
                if not taken:
                    return False
        except BaseException as exc:
            await self._undo_attempts(owner)
            if not isinstance(exc, asyncio.CancelledError) and cancelled_meanwhile():
                # The lost cancellation ran into the socket's timeout: the caller asked
                # for the cancellation, not for this error.
                raise asyncio.CancelledError from exc
            raise
        self._took(owner, value, sent_at)
        return True

    async def _undo_attempts(self, owner: str) -> None:
        """The acquire was cancelled (its task, a timeout around it) or failed while a round
        trip was under way. That attempt may have taken the lock, or a release may have
        handed it over, with the reply unread; or it reserved a place. Give back whatever
        ``owner`` holds, so that a caller who is gone holds nothing, rather than the name
        staying locked, unrenewed, until its ttl runs out."""
        try:
            await self._abandon(owner)
            await self._release(owner, 0)
        except LockBackendError:
            self._withdraw_failed()

    async def _wait_for(
        self,
        attempt: Callable[[], Awaitable[tuple[bool, int]]],
        wait: float,
        abandon: Callable[[], Awaitable[None]],
    ) -> tuple[bool, int]:
        """Retry ``attempt`` on each release published on the channels (or at its hint)
        until it succeeds or ``wait`` seconds pass; ``abandon`` runs when giving up (when
        the waiting task is cancelled, :meth:`_undo_attempts` does)."""
        deadline = time.monotonic() + wait
        outage = Outage(deadline)
        async with self._conn.notifier().listening(self._channels) as woken:
            while True:
                try:
                    taken, value = await attempt()
                except LockBackendError as error:
                    await woken.wait(outage.pause(error))  # see Outage
                    continue
                outage.answered()
                if taken:
                    return True, value
                sleep = retry_in(deadline, value)
                if sleep is None:
                    break
                await woken.wait(sleep)
        try:
            await abandon()
        except LockBackendError:
            self._withdraw_failed()
        return False, value

    async def release(self, delay: float = 0.0) -> None:
        """Give the lock back. With ``delay`` seconds > 0 what it covered stays locked, with
        no owner, for that long (release delay).

        Raises :class:`LockExpired` or :class:`LockTaken` if the lock was lost meanwhile;
        another owner's lock is never touched. If Redis does not answer
        (:class:`LockBackendError`) the handle still owns the lock, no longer renewed: call
        ``release`` again, or let the lock run out within its ttl.
        """
        owner, delay_ms = self._begin_release(delay)
        try:
            code = await self._release(owner, delay_ms)
        except BaseException:
            # Also when the task was cancelled while the release was under way.
            self._release_unsent(owner)
            raise
        self._released(code)

    async def extend(self, ttl: float | None = None) -> float:
        """Set the lock's remaining time to ``ttl`` seconds (default: its ttl) and renew it
        to that length from now on. Sets, never adds. Returns the seconds granted: less than
        asked when ``max_hold`` is near, 0.0 once it has passed.

        On a handle already found lost it raises that :class:`LockLost` again, with no
        round trip."""
        owner, _, ttl_ms, gen = self._begin_extend(ttl)
        sent_at = time.monotonic()
        calls, decode = renew_calls(self._conn, [(self, owner, ttl_ms, gen)])  # type: ignore[arg-type]
        (code,) = decode(await self._conn.batch(calls))
        return self._extended(owner, code, sent_at, gen)

    # -- context manager ---------------------------------------------------------------------

    async def __aenter__(self: H) -> H:
        if not await self.acquire():
            raise self._timed_out()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._mine():
            return  # the body gave it back itself (release): nothing to release
        try:
            await self.release()
        except (LockLost, LockBackendError):
            self._exit_release_failed(exc)

    # -- the hooks of HandleState ------------------------------------------------------------

    def _start_renewing(self) -> None:
        self._beat = heartbeat()
        self._beat.add(self)

    def _stop_renewing(self) -> None:
        if self._beat is not None:
            self._beat.remove(self)

    def _call_on_lost(self) -> None:
        assert self.on_lost is not None
        try:
            result = self.on_lost(self)
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                _callbacks.add(task)
                task.add_done_callback(_callback_done)
        except Exception:
            log.exception("on_lost callback of %r failed", self.name)

    # -- helpers -----------------------------------------------------------------------------

    def _describe_holder(self, *, named: bool = True) -> list[Any]:
        """Field, value pairs the scripts store about the holder; ``thread`` names the
        asyncio task that acquired (``thread name/task name``)."""
        task = asyncio.current_task()
        place = threading.current_thread().name
        if task is not None:
            place += "/" + task.get_name()
        return holder_fields(self, pid=_Process.pid, thread=place, named=named)


def _callback_done(task: asyncio.Task[Any]) -> None:
    _callbacks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("on_lost callback failed", exc_info=task.exception())
