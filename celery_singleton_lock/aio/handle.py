"""The asyncio lock handle: the asyncio runner of :class:`..core.handle_ops.HandleOps` (see
there for how a lock kind is built). A handle works through an :class:`AsyncConnection`
(given one, or an ``AsyncLockClient``), and belongs to the event loop that acquired it: its
loop's heartbeat task renews it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from types import TracebackType
from typing import Any, TypeVar

from ..core.handle import HolderRecord
from ..core.handle_ops import HandleOps
from ..core.handle_state import NO_LOCK, _Process
from ..core.holder import holder_fields
from ..core.options import LockOptions, ProcessOptions, options_after_two, options_only
from ..core.steps import Steps
from ..exceptions import LockBackendError, LockLost
from .connection import AsyncConnection, HasAsyncConnection, async_connection_of
from .heartbeat import AsyncHeartbeat, heartbeat

log = logging.getLogger("celery_singleton_lock.lease")

H = TypeVar("H", bound="AsyncLockHandle")
T = TypeVar("T")

#: Callbacks run when a handle is found lost that are still running (a task nobody else
#: holds a reference to could be collected half-way).
_callbacks: set[asyncio.Task[Any]] = set()


class AsyncLockHandle(HandleOps):
    """Base of every async lock handle (lease, read/upgradable/write, range, multi).

    Made by the factories of :class:`AsyncLockClient`. ``await acquire()`` takes the lock,
    ``await release()`` gives it back, and while it is held the event loop's heartbeat task
    renews it every ``ttl / TICKS_PER_TTL`` seconds, so a holder whose loop stops frees it
    within ``ttl``. ``async with`` acquires (waiting up to ``wait`` seconds, else raising
    :class:`LockTimeout`) and releases on exit.

    The state and its decisions are :class:`HandleState`'s and the operations
    :class:`HandleOps`', as for the sync handle; this class awaits their steps. ``on_lost``
    is called with the handle from the heartbeat task or the code whose check() or extend()
    found the lock lost; a coroutine function's result is run as a task of the handle's loop.
    """

    __slots__ = ("_conn", "_beat")

    _stall_causes = "event loop blocked or stopped, or Redis unreachable"
    #: Every state change runs on the handle's event loop: no lock needed.
    _state_lock = NO_LOCK
    _conn: AsyncConnection

    @options_after_two(LockOptions[Any])
    def __init__(
        self, client: AsyncConnection | HasAsyncConnection, name: str, options: LockOptions[Any]
    ) -> None:
        self._setup(client, name, options)

    def _setup(self, client: Any, name: Any, options: LockOptions[Any]) -> None:
        self._configure(options.check(name))
        self._conn = async_connection_of(client)
        self._beat: AsyncHeartbeat | None = None

    # -- the runner --------------------------------------------------------------------------

    async def _run(self, steps: Steps[T], *, cancellable: bool = False) -> T:
        """Await an operation's steps (:meth:`.connection.AsyncConnection.run`, where
        ``cancellable`` is described)."""
        return await self._conn.run(steps, cancellable=cancellable)

    # -- who holds it -----------------------------------------------------------------------

    async def holders(self) -> list[HolderRecord]:
        """Who holds what this handle locks now, as :meth:`LockHandle.holders`."""
        return await self._run(self._holders())

    @options_only(ProcessOptions)
    async def release_holder(self, process: ProcessOptions) -> bool:
        """Release what run ``task_id`` in process ``pid`` on ``host`` (default: this
        machine) holds of this lock, as :meth:`LockHandle.release_holder`; True if
        something was released."""
        return await self._run(self._release_holder(process))

    # -- acquire / release / extend ----------------------------------------------------------

    async def acquire(self, wait: float | None = None) -> bool:
        """Take the lock; True if taken, False if ``wait`` seconds passed first.

        ``wait`` defaults to the handle's own; ``math.inf`` waits forever. A blocked call is
        woken by a release (pub/sub), or when a conflicting holder's lease could have run out.
        """
        return await self._run(self._acquire_steps(wait), cancellable=True)

    async def release(self, delay: float = 0.0) -> None:
        """Give the lock back. With ``delay`` seconds > 0 what it covered stays locked, with
        no owner, for that long (release delay).

        Raises :class:`LockExpired` or :class:`LockTaken` if the lock was lost meanwhile;
        another owner's lock is never touched. If Redis does not answer
        (:class:`LockBackendError`) the handle still owns the lock, no longer renewed: call
        ``release`` again, or let the lock run out within its ttl.
        """
        await self._run(self._release_steps(delay))

    async def extend(self, ttl: float | None = None) -> float:
        """Set the lock's remaining time to ``ttl`` seconds (default: its ttl) and renew it
        to that length from now on. Sets, never adds. Returns the seconds granted: less than
        asked when ``max_hold`` is near, 0.0 once it has passed.

        On a handle already found lost it raises that :class:`LockLost` again, with no
        round trip."""
        return await self._run(self._extend_steps(ttl))

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
