"""What every async lock handle shares: the state machine of :class:`..handle.LockHandle`
(held, lost, check, the wait loop, the lost-lock bookkeeping) with awaitable round trips.

A subclass supplies them: ``_try_acquire(owner, reserve)``, ``_release(owner, delay_ms)``
and the classmethod ``_renew_script_call(conn, entries)`` the heartbeat batches. A handle
works through an :class:`AsyncConnection` (given one, or an ``AsyncLockClient``), and
belongs to the event loop that acquired it: its loop's heartbeat task renews it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

from ..core import validate
from ..core.handle import hint_seconds, holder_fields, lost_error
from ..core.heartbeat import renew_calls
from ..core.scripts import MAX_HOLD_REACHED, ScriptCall
from ..exceptions import (
    LockBackendError,
    LockError,
    LockExpired,
    LockLost,
    LockNotHeld,
    LockTimeout,
)
from .connection import AsyncConnection, HasAsyncConnection, async_connection_of
from .heartbeat import AsyncHeartbeat, heartbeat

log = logging.getLogger("celery_singleton_lock.lease")
lost_log = logging.getLogger("celery_singleton_lock.lost")

H = TypeVar("H", bound="AsyncLockHandle")

#: (handle, owner token, ttl ms): one renewal the subclass turns into script arguments.
RenewEntry = tuple[Any, str, int]

#: Callbacks run when a handle is found lost that are still running (a task nobody else
#: holds a reference to could be collected half-way).
_callbacks: set[asyncio.Task[Any]] = set()


class AsyncLockHandle:
    """Base of every async lock handle (lease, read/upgradable/write, range, multi).

    Made by the factories of :class:`AsyncLockClient`. ``await acquire()`` takes the lock,
    ``await release()`` gives it back, and while it is held the event loop's heartbeat task
    renews it every ``ttl / 3`` seconds, so a holder whose loop stops frees it within ``ttl``.
    ``async with`` acquires (waiting up to ``wait`` seconds, else raising
    :class:`LockTimeout`) and releases on exit.
    """

    kind = "lease"

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
        self.name = validate.check_name(name)
        #: Seconds the lock lasts unless renewed; the heartbeat renews it to this length.
        self.ttl = validate.check_positive(ttl, "ttl")
        self.heartbeat = validate.check_bool(heartbeat, "heartbeat")
        #: Seconds after acquisition past which the lock is no longer renewed (None: never).
        self.max_hold = validate.check_max_hold(max_hold, self.ttl)
        #: Default seconds ``acquire`` waits for a busy lock (``math.inf``: forever).
        self.wait = validate.check_wait(wait)
        self.owner_info = validate.check_owner_info(owner_info)
        #: Called with this handle when it is found lost, from the heartbeat task or the
        #: code whose check() or extend() found it; a coroutine function's result is run as
        #: a task of the handle's loop.
        self.on_lost = validate.check_callable(on_lost, "on_lost")
        self._conn = async_connection_of(client)
        self._ttl_ms = validate.seconds_to_ms(self.ttl)
        self._max_hold_ms = 0 if self.max_hold is None else validate.seconds_to_ms(self.max_hold)
        self._owner: str | None = None
        self._pid = 0
        self._token: int | None = None
        self._lost: LockLost | None = None
        self._expires_at = 0.0  # monotonic; a conservative local view of the server's expiry
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
        """One release round trip: 1 released, else GONE or TAKEN."""
        raise NotImplementedError

    @classmethod
    def _renew_script_call(cls, conn: AsyncConnection, entries: list[RenewEntry]) -> ScriptCall:
        """One script call renewing ``entries``; its reply has one code per entry."""
        raise NotImplementedError

    # -- public state ------------------------------------------------------------------------

    @property
    def token(self) -> int | None:
        """The fencing token of the current (or last) acquisition: strictly increasing for
        this name across every acquisition by anyone, sync or async."""
        return self._token

    @property
    def held(self) -> bool:
        """True while this handle holds the lock, as far as this process can tell."""
        return self._mine() and self._lost is None and time.monotonic() < self._expires_at

    @property
    def lost(self) -> bool:
        """True once the lock is known lost: found gone or taken by a renewal, or its time
        ran out without a renewal (a blocked loop, Redis unreachable, max-hold passed)."""
        if self._lost is not None:
            return True
        return self._mine() and time.monotonic() >= self._expires_at

    def check(self) -> None:
        """Raise :class:`LockLost` if the lock is lost, :class:`LockNotHeld` if it is not
        held. No round trip (not a coroutine)."""
        if self._lost is not None:
            raise self._lost.with_traceback(None)
        if not self._mine():
            raise LockNotHeld(f"lock {self.name!r} is not held", name=self.name)
        if time.monotonic() >= self._expires_at:
            self._mark_lost(
                self._owner,
                LockExpired(
                    f"lease on {self.name!r} ran out before it was renewed"
                    " (event loop blocked or stopped, Redis unreachable or max_hold reached)",
                    name=self.name,
                ),
            )
            assert self._lost is not None
            raise self._lost.with_traceback(None)

    # -- acquire / release / extend ----------------------------------------------------------

    async def acquire(self, wait: float | None = None) -> bool:
        """Take the lock; True if taken, False if ``wait`` seconds passed first.

        ``wait`` defaults to the handle's own; ``math.inf`` waits forever. A blocked call is
        woken by a release (pub/sub), or when a conflicting holder's lease could have run out.
        """
        wait = self.wait if wait is None else validate.check_wait(wait)
        if self._mine() and self._lost is None:
            raise LockError(f"lock {self.name!r} is already held by this handle", name=self.name)
        owner = self._new_owner()
        sent_at = time.monotonic()
        taken, value = await self._try_acquire(owner, wait > 0)
        if not taken:
            if wait <= 0:
                return False

            async def attempt() -> tuple[bool, int]:
                nonlocal sent_at
                sent_at = time.monotonic()
                return await self._try_acquire(owner, True)

            taken, value = await self._wait_for(attempt, wait, lambda: self._abandon(owner))
            if not taken:
                return False
        self._took(owner, value, sent_at)
        return True

    def _new_owner(self) -> str:
        return os.urandom(16).hex()

    async def _wait_for(
        self,
        attempt: Callable[[], Awaitable[tuple[bool, int]]],
        wait: float,
        abandon: Callable[[], Awaitable[None]],
    ) -> tuple[bool, int]:
        """Retry ``attempt`` on each release published on the channels (or at its hint)
        until it succeeds or ``wait`` seconds pass; ``abandon`` runs when giving up (also
        when the waiting task is cancelled)."""
        deadline = time.monotonic() + wait
        done = False
        try:
            async with self._conn.notifier().listening(self._channels) as woken:
                while True:
                    taken, value = await attempt()
                    if taken:
                        done = True
                        return True, value
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False, value
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(woken.wait(), min(hint_seconds(value), remaining))
                    woken.clear()
        finally:
            if not done:
                try:
                    await abandon()
                except LockBackendError:
                    log.warning("could not withdraw the wait of %r", self.name, exc_info=True)

    def _took(self, owner: str, token: int, sent_at: float) -> None:
        self._owner = owner
        self._pid = os.getpid()
        self._token = token
        self._lost = None
        self._expires_at = sent_at + min(self._ttl_ms, self._max_hold_ms or math.inf) / 1000
        if self.heartbeat:
            self._beat = heartbeat()
            self._beat.add(self)

    async def release(self, delay: float = 0.0) -> None:
        """Give the lock back. With ``delay`` seconds > 0 what it covered stays locked, with
        no owner, for that long (delay-after).

        Raises :class:`LockExpired` or :class:`LockTaken` if the lock was lost meanwhile;
        another owner's lock is never touched. If Redis does not answer
        (:class:`LockBackendError`) the handle still owns the lock, no longer renewed: call
        ``release`` again, or let the lock run out within its ttl.
        """
        delay = validate.check_delay(delay)
        owner = self._forget()
        try:
            code = await self._release(owner, validate.seconds_to_ms(delay) if delay > 0 else 0)
        except BaseException:
            # The release may not have reached Redis (or the task was cancelled while it was
            # under way): keep the owner token so it can be retried.
            if self._owner is None:
                self._owner = owner
            raise
        if code == 1:
            self._lost = None
            return
        error = lost_error(self.name, code, "release")
        if self._lost is None:
            # Found lost only now: on_lost fires here, once (see the sync handle).
            self._lost = error
            self._announce_lost(error)
        raise error

    def _forget(self) -> str:
        """Stop renewing and drop the owner token (the first half of every release)."""
        if not self._mine():
            raise LockNotHeld(f"lock {self.name!r} is not held", name=self.name)
        if self._beat is not None:
            self._beat.remove(self)
        owner, self._owner = self._owner, None
        assert owner is not None
        return owner

    async def extend(self, ttl: float | None = None) -> float:
        """Set the lock's remaining time to ``ttl`` seconds (default: its ttl) and renew it
        to that length from now on. Sets, never adds. Returns the seconds granted: less than
        asked when ``max_hold`` is near, 0.0 once it has passed."""
        ttl = self.ttl if ttl is None else validate.check_positive(ttl, "ttl")
        if self.max_hold is not None and ttl > self.max_hold:
            ttl = self.max_hold
        if not self._mine():
            raise LockNotHeld(f"lock {self.name!r} is not held", name=self.name)
        owner = self._owner
        assert owner is not None
        ttl_ms = validate.seconds_to_ms(ttl)
        sent_at = time.monotonic()
        calls, decode = renew_calls(self._conn, [(self, owner, ttl_ms)])  # type: ignore[arg-type]
        (code,) = decode(await self._conn.batch(calls))
        if code == MAX_HOLD_REACHED:
            return max(0.0, self._expires_at - time.monotonic())
        if code <= 0:
            error = lost_error(self.name, code, "extend")
            self._mark_lost(owner, error)
            raise error
        self.ttl, self._ttl_ms = ttl, ttl_ms
        self._expires_at = sent_at + code / 1000
        if self.heartbeat:
            self._beat = heartbeat()
            self._beat.add(self)  # the tick period may have changed
        return code / 1000

    # -- context manager ---------------------------------------------------------------------

    async def __aenter__(self: H) -> H:
        if not await self.acquire():
            raise LockTimeout(
                f"lock {self.name!r} not acquired within {self.wait} s", name=self.name
            )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except (LockLost, LockBackendError):
            if exc_type is None:
                raise
            log.warning("release of %r failed while handling %r", self.name, exc, exc_info=True)

    def __repr__(self) -> str:
        state = "lost" if self.lost else "held" if self.held else "free"
        return f"<{type(self).__name__} {self.name!r} {state} token={self._token}>"

    # -- heartbeat callbacks -----------------------------------------------------------------

    def _renewed(self, owner: str | None, code: int, sent_at: float) -> None:
        """The heartbeat's result for this handle; ``owner`` is the owner it renewed for."""
        if code > 0:
            if self._owner == owner:
                self._expires_at = sent_at + code / 1000
        elif code == MAX_HOLD_REACHED:
            if self._beat is not None:
                self._beat.remove(self)
            log.info("lock %r reached max_hold; it runs out within its ttl", self.name)
        else:
            self._mark_lost(owner, lost_error(self.name, code, "heartbeat"))

    def _renewal_failed(self, owner: str | None, error: LockBackendError) -> None:
        """Redis did not answer a tick: keep trying until the lock would have expired."""
        if time.monotonic() >= self._expires_at:
            lost = LockExpired(
                f"lease on {self.name!r} ran out while Redis was unreachable: {error}",
                name=self.name,
            )
            lost.reason = "unreachable"
            self._mark_lost(owner, lost)

    def _mark_lost(self, owner: str | None, error: LockLost) -> None:
        if self._owner != owner or self._lost is not None:
            return
        self._lost = error
        self._announce_lost(error)

    def _announce_lost(self, error: LockLost) -> None:
        """Stop renewing, log, and call ``on_lost`` (the handle was just marked lost)."""
        if self._beat is not None:
            self._beat.remove(self)
        lost_log.warning("lock %r lost (%s): %s", self.name, error.reason, error)
        if self.on_lost is None:
            return
        try:
            result = self.on_lost(self)
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                _callbacks.add(task)
                task.add_done_callback(_callback_done)
        except Exception:
            log.exception("on_lost callback of %r failed", self.name)

    # -- helpers -----------------------------------------------------------------------------

    def _mine(self) -> bool:
        return self._owner is not None and self._pid == os.getpid()

    def _describe_holder(self, *, named: bool = True) -> list[Any]:
        """Field, value pairs the scripts store about the holder; ``thread`` names the
        asyncio task that acquired (``thread name/task name``)."""
        task = asyncio.current_task()
        place = threading.current_thread().name
        if task is not None:
            place += "/" + task.get_name()
        return holder_fields(self, pid=os.getpid(), thread=place, named=named)


def _callback_done(task: asyncio.Task[Any]) -> None:
    _callbacks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("on_lost callback failed", exc_info=task.exception())
