"""Async reader-writer and range locks: the interval engine of :mod:`..intervals` (same keys,
same scripts) with awaitable round trips. Semantics as in :mod:`..rwlock` and
:mod:`..rangelock`: writer preference through short reservations, upgrade/downgrade,
shrink, writes nested in an upgradable range."""

from __future__ import annotations

import math
from typing import Any

from ..core import validate
from ..core.handle import lost_error
from ..core.scripts import ScriptCall, bound_to
from ..exceptions import ConfigurationError, LockError, LockNotHeld
from ..kinds.intervals import (
    MODE_NAMES,
    NOT_INSIDE,
    PARENT_GONE,
    RESERVATION_MS,
    IntervalHandle,
    IntervalKeys,
    IntervalScripts,
    check_interval,
    interval_keys,
)
from ..kinds.rangelock import FAMILY as RANGE_FAMILY
from ..kinds.rwlock import FAMILY as RW_FAMILY
from . import wire
from .connection import AsyncConnection, HasAsyncConnection, async_connection_of
from .handle import AsyncLockHandle, RenewEntry


def interval_scripts(conn: AsyncConnection) -> IntervalScripts:
    """The interval scripts of ``conn`` (registered on first use, no I/O)."""
    return bound_to(conn, IntervalScripts)


async def release_hold(
    conn: AsyncConnection,
    keys: IntervalKeys,
    owner: str,
    delay_ms: int,
    token: str = "",
    renewed_ms: str = "",
) -> int:
    """One run of interval_release.lua (see :func:`..intervals.release_hold`)."""
    code = await conn.script(
        interval_scripts(conn).release,
        keys.all(owner)[:11],
        wire.interval_release_args(owner, delay_ms, keys.channel, token, renewed_ms),
    )
    return int(code)


class AsyncIntervalHandle(AsyncLockHandle):
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
        self.mode = mode
        self.lo, self.hi = lo, hi
        self._parent = parent
        self._keys = interval_keys(self._conn.prefix, self.name, self._family)
        self._channels = (self._keys.channel,)

    async def _try_acquire(self, owner: str, reserve: bool) -> tuple[bool, int]:
        parent = ""
        if self._parent is not None:
            if not self._parent._mine() or self._parent._owner is None:
                raise LockNotHeld(
                    f"the upgradable hold on {self.name!r} is not held", name=self.name
                )
            parent = self._parent._owner
        queue = RESERVATION_MS if reserve and self.mode == "w" else 0
        code, value = await self._conn.script(
            interval_scripts(self._conn).acquire,
            self._keys.all(owner),
            wire.interval_acquire_args(
                owner, self.mode, self.lo, self.hi, self._ttl_ms, self._max_hold_ms, queue,
                parent, self._keys.channel, self._describe_holder(),
            ),
        )  # fmt: skip
        code, value = int(code), int(value)
        if code == PARENT_GONE:
            raise LockNotHeld(
                f"the upgradable hold on {self.name!r} is gone or does not cover"
                f" [{self.lo}, {self.hi}]",
                name=self.name,
            )
        if code == 1:
            return True, value
        return False, wire.interval_wait_hint(value, queued=bool(queue))

    async def _abandon(self, owner: str) -> None:
        if self.mode == "w":
            await self._release(owner, 0)

    async def _release(self, owner: str, delay_ms: int) -> int:
        return await release_hold(self._conn, self._keys, owner, delay_ms)

    async def _change(
        self, op: str, lo: float = 0.0, hi: float = 0.0, reserve: int = 0
    ) -> tuple[int, int]:
        owner = self._owner
        if owner is None or not self._mine():
            raise LockNotHeld(f"lock {self.name!r} is not held", name=self.name)
        code, value = await self._conn.script(
            interval_scripts(self._conn).change,
            self._keys.all(owner)[:11],
            wire.interval_change_args(op, owner, lo, hi, reserve, self._keys.channel),
        )
        return int(code), int(value)

    def _changed_lost(self, op: str) -> LockError:
        error = lost_error(self.name, 0, op)
        self._mark_lost(self._owner, error)
        return error

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
        if self.mode != "u":
            raise LockError(f"only an upgradable hold can upgrade ({self.kind})", name=self.name)
        wait = self.wait if wait is None else validate.check_wait(wait)
        if self._upgraded:
            return True
        reserve = wait > 0

        async def attempt() -> tuple[bool, int]:
            code, value = await self._change("upgrade", reserve=RESERVATION_MS if reserve else 0)
            if code == PARENT_GONE:
                raise self._changed_lost("upgrade")
            return code == 1, wire.interval_wait_hint(value, queued=reserve)

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
        if code != 1:
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
        low, high = check_interval(lo, hi)
        if low < self.lo or high > self.hi:
            raise ConfigurationError(
                "lo", f"[{lo}, {hi}] is not inside the held [{self.lo}, {self.hi}]"
            )
        code, _ = await self._change("shrink", low, high)
        if code == NOT_INSIDE:  # pragma: no cover - the check above prevents it
            raise ConfigurationError("lo", f"[{lo}, {hi}] is not inside the held range")
        if code != 1:
            raise self._changed_lost("shrink")
        self.lo, self.hi = low, high

    def write(self, lo: float, hi: float, **options: Any) -> AsyncRangeLockHandle:
        """A write hold (not yet acquired) on [lo, hi] inside this upgradable hold."""
        if self.mode != "u":
            raise LockError("only an upgradable range can nest a write", name=self.name)
        low, high = check_interval(lo, hi)
        if low < self.lo or high > self.hi:
            raise ConfigurationError(
                "lo", f"[{lo}, {hi}] is not inside the upgradable [{self.lo}, {self.hi}]"
            )
        return AsyncRangeLockHandle(self._conn, self.name, "w", low, high, parent=self, **options)


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
