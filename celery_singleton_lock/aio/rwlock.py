"""Async reader-writer and range locks: the holds of :mod:`..kinds.rwlock` and
:mod:`..kinds.rangelock` (same keys, same scripts, the same operations) awaited by the
asyncio runner. Semantics as there: writer preference through short reservations,
upgrade/downgrade, shrink, writes nested in an upgradable range."""

from __future__ import annotations

from typing import Any

from ..kinds.intervals import IntervalOps
from ..kinds.rangelock import RangeLockMaker, RangeLockOps
from ..kinds.rwlock import RWLockMaker, RWLockOps
from .connection import AsyncConnection, HasAsyncConnection, async_connection_of
from .handle import AsyncLockHandle


class AsyncIntervalHandle(IntervalOps, AsyncLockHandle):
    """A hold on [lo, hi] of an interval lock, in one mode ('r', 'u' or 'w')."""

    def __init__(
        self,
        client: AsyncConnection | HasAsyncConnection,
        name: str,
        mode: str,
        lo: float,
        hi: float,
        *,
        parent: AsyncIntervalHandle | None = None,
        call: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(client, name, **options)
        self._set_interval(self._conn.prefix, mode, lo, hi, parent, call)


class AsyncRWLockHandle(RWLockOps, AsyncLockHandle):
    """One hold of a reader-writer lock: ``kind`` is ``read``, ``upgradable`` or ``write``.
    An upgradable hold can :meth:`upgrade` to the writer and :meth:`downgrade` back."""

    def __init__(
        self,
        client: AsyncConnection | HasAsyncConnection,
        name: str,
        mode: str,
        *,
        call: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(client, name, **options)
        self._set_mode(self._conn.prefix, mode, call)

    async def upgrade(self, wait: float | None = None) -> bool:
        """Become the writer without letting go; True once upgraded, False if ``wait``
        seconds (default: the handle's own) passed first."""
        return await self._run(self._upgrade(wait))

    async def downgrade(self) -> None:
        """Go back from writer to upgradable: readers may come in again at once."""
        await self._run(self._downgrade())


class AsyncRangeLockHandle(RangeLockOps, AsyncIntervalHandle):
    """A hold on [lo, hi] of a range lock; ``mode`` is 'r', 'u' or 'w'."""

    async def shrink(self, lo: float, hi: float) -> None:
        """Narrow the held interval to [lo, hi] (inside the current one) without letting go;
        as the sync handle's: after a LockBackendError (or a cancellation) the handle says
        it holds [lo, hi]."""
        await self._run(self._shrink(lo, hi))

    def write(self, lo: float, hi: float, **options: Any) -> AsyncRangeLockHandle:
        """A write hold (not yet acquired) on [lo, hi] inside this upgradable hold."""
        low, high = self._nested_write(lo, hi)
        return AsyncRangeLockHandle(self._conn, self.name, "w", low, high, parent=self, **options)


class AsyncRWLock(RWLockMaker[AsyncRWLockHandle]):
    """A reader-writer lock on one name; makes handles (not yet acquired) with the options
    of :meth:`AsyncLockClient.lease`."""

    def __init__(self, client: AsyncConnection | HasAsyncConnection, name: str) -> None:
        super().__init__(name, async_connection_of(client), AsyncRWLockHandle)


class AsyncRangeLock(RangeLockMaker[AsyncRangeLockHandle]):
    """A range lock on one name; makes handles (not yet acquired) on closed intervals."""

    def __init__(self, client: AsyncConnection | HasAsyncConnection, name: str) -> None:
        super().__init__(name, async_connection_of(client), AsyncRangeLockHandle)
