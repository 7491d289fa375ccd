"""Async reader-writer and range locks: the interval engine of :mod:`..intervals` (same keys,
same scripts) with awaitable round trips. Semantics as in :mod:`..rwlock` and
:mod:`..rangelock`: writer preference through short reservations, upgrade/downgrade,
shrink, writes nested in an upgradable range."""

from __future__ import annotations

import math
from typing import Any

from ..core import validate
from ..core.replies import IntervalReply
from ..core.scripts import ScriptCall
from ..exceptions import ConfigurationError, LockNotHeld
from ..kinds.intervals import (
    MODE_NAMES,
    RESERVATION_MS,
    IntervalHandle,
    IntervalHold,
    check_interval,
    release_call,
    scripts,
)
from ..kinds.rangelock import FAMILY as RANGE_FAMILY
from ..kinds.rangelock import describe_hold
from ..kinds.rwlock import FAMILY as RW_FAMILY
from .connection import AsyncConnection, HasAsyncConnection, async_connection_of
from .handle import AsyncLockHandle, RenewEntry


class AsyncIntervalHandle(IntervalHold, AsyncLockHandle):
    """A hold on [lo, hi] of an interval lock, in one mode ('r', 'u' or 'w')."""

    _family = RW_FAMILY

    def __init__(
        self,
        client: AsyncConnection | HasAsyncConnection,
        name: str,
        mode: str,
        lo: float,
        hi: float,
        *,
        parent: AsyncIntervalHandle | None = None,
        **options: Any,
    ) -> None:
        super().__init__(client, name, **options)
        self._set_interval(self._conn.prefix, mode, lo, hi, parent)
        self._channels = (self.keys.channel,)

    async def _try_acquire(self, owner: str, reserve: bool) -> tuple[bool, int]:
        keys, args, queued = self._acquire_call(owner, reserve)
        reply = await self._conn.script(scripts(self._conn).acquire, keys, args)
        return self._acquired(reply, queued)

    async def _abandon(self, owner: str) -> None:
        if self.mode == "w":
            await self._release(owner, 0)

    async def _release(self, owner: str, delay_ms: int) -> int:
        return int(await self._conn.script(*release_call(self._conn, self.keys, owner, delay_ms)))

    async def _change(
        self, op: str, lo: float = 0.0, hi: float = 0.0, reserve: int = 0
    ) -> tuple[int, int]:
        keys, args = self._change_call(op, lo, hi, reserve)
        code, value = await self._conn.script(scripts(self._conn).change, keys, args)
        return int(code), int(value)

    @classmethod
    def _renew_script_call(cls, conn: AsyncConnection, entries: list[RenewEntry]) -> ScriptCall:
        # The same layout as the sync holds: the handles carry the same _keys.
        return IntervalHandle._renew_script_call(conn, entries)  # type: ignore[arg-type]


class AsyncRWLockHandle(AsyncIntervalHandle):
    """One hold of a reader-writer lock: ``kind`` is ``read``, ``upgradable`` or ``write``.
    An upgradable hold can :meth:`upgrade` to the writer and :meth:`downgrade` back."""

    _family = RW_FAMILY

    def __init__(
        self, client: AsyncConnection | HasAsyncConnection, name: str, mode: str, **options: Any
    ) -> None:
        super().__init__(client, name, mode, -math.inf, math.inf, **options)
        self.kind = MODE_NAMES[mode]
        self._upgraded = False

    @property
    def upgraded(self) -> bool:
        """True while an upgradable hold is upgraded to the writer."""
        return self._upgraded

    async def upgrade(self, wait: float | None = None) -> bool:
        """Become the writer without letting go; True once upgraded, False if ``wait``
        seconds (default: the handle's own) passed first."""
        wait = self._begin_upgrade(wait)
        if self._upgraded:
            return True
        reserve = wait > 0

        async def attempt() -> tuple[bool, int]:
            code, value = await self._change("upgrade", reserve=RESERVATION_MS if reserve else 0)
            return self._upgrade_tried(code, value, reserve)

        done, _ = await attempt()
        if not done and reserve:
            done, _ = await self._wait_for(attempt, wait, self._withdraw)
        self._upgraded = done
        return done

    async def downgrade(self) -> None:
        """Go back from writer to upgradable: readers may come in again at once."""
        if not self._upgraded:
            raise LockNotHeld(f"the hold on {self.name!r} is not upgraded", name=self.name)
        code, _ = await self._change("downgrade")
        if code != IntervalReply.DONE:
            raise self._changed_lost("downgrade")
        self._upgraded = False

    async def _withdraw(self) -> None:
        if self._mine():
            await self._change("unreserve")

    def _took(self, owner: str, token: int, sent_at: float) -> None:
        self._upgraded = False
        super()._took(owner, token, sent_at)

    async def release(self, delay: float = 0.0) -> None:  # noqa: D102 - as the base's
        await super().release(delay)
        self._upgraded = False


class AsyncRangeLockHandle(AsyncIntervalHandle):
    """A hold on [lo, hi] of a range lock; ``mode`` is 'r', 'u' or 'w'."""

    kind = "range"
    _family = RANGE_FAMILY

    async def shrink(self, lo: float, hi: float) -> None:
        """Narrow the held interval to [lo, hi] (inside the current one) without letting go."""
        low, high = self._inside(lo, hi, "held")
        code, _ = await self._change("shrink", low, high)
        if code == IntervalReply.NOT_INSIDE:  # pragma: no cover - the check above prevents it
            raise ConfigurationError("lo", f"[{lo}, {hi}] is not inside the held range")
        if code != IntervalReply.DONE:
            raise self._changed_lost("shrink")
        self.lo, self.hi = low, high

    def write(self, lo: float, hi: float, **options: Any) -> AsyncRangeLockHandle:
        """A write hold (not yet acquired) on [lo, hi] inside this upgradable hold."""
        low, high = self._nested_write(lo, hi)
        return AsyncRangeLockHandle(self._conn, self.name, "w", low, high, parent=self, **options)

    def __repr__(self) -> str:
        return describe_hold(self)


class AsyncRWLock:
    """A reader-writer lock on one name; makes handles (not yet acquired) with the options
    of :meth:`AsyncLockClient.lease`."""

    def __init__(self, client: AsyncConnection | HasAsyncConnection, name: str) -> None:
        self.name = validate.check_name(name)
        self._conn = async_connection_of(client)

    def read(self, **options: Any) -> AsyncRWLockHandle:
        """A shared hold."""
        return AsyncRWLockHandle(self._conn, self.name, "r", **options)

    def upgradable(self, **options: Any) -> AsyncRWLockHandle:
        """A read hold that excludes other upgradables and can become the writer."""
        return AsyncRWLockHandle(self._conn, self.name, "u", **options)

    def write(self, **options: Any) -> AsyncRWLockHandle:
        """An exclusive hold; preferred over new readers while it waits."""
        return AsyncRWLockHandle(self._conn, self.name, "w", **options)

    def __repr__(self) -> str:
        return f"<AsyncRWLock {self.name!r}>"


class AsyncRangeLock:
    """A range lock on one name; makes handles (not yet acquired) on closed intervals."""

    def __init__(self, client: AsyncConnection | HasAsyncConnection, name: str) -> None:
        self.name = validate.check_name(name)
        self._conn = async_connection_of(client)

    def read(self, lo: float, hi: float, **options: Any) -> AsyncRangeLockHandle:
        """A shared hold on [lo, hi]."""
        return self._handle("r", lo, hi, options)

    def upgradable(self, lo: float, hi: float, **options: Any) -> AsyncRangeLockHandle:
        """A read hold on [lo, hi] that can nest write holds."""
        return self._handle("u", lo, hi, options)

    def write(self, lo: float, hi: float, **options: Any) -> AsyncRangeLockHandle:
        """An exclusive hold on [lo, hi]."""
        return self._handle("w", lo, hi, options)

    def _handle(
        self, mode: str, lo: float, hi: float, options: dict[str, Any]
    ) -> AsyncRangeLockHandle:
        low, high = check_interval(lo, hi)
        return AsyncRangeLockHandle(self._conn, self.name, mode, low, high, **options)

    def __repr__(self) -> str:
        return f"<AsyncRangeLock {self.name!r}>"
