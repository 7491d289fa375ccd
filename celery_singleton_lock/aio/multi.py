"""Async multi-key locks: :class:`..multi.MultiLease` (same keys and scripts: all names taken
atomically by one script, so no deadlock) with awaitable round trips."""

from __future__ import annotations

from typing import Any

from ..core.heartbeat import RenewUnit
from ..core.scripts import ScriptCall
from ..kinds.lease import renew_lease_keys
from ..kinds.multi import (
    MultiLease,
    acquire_args,
    acquired,
    check_names,
    key_order,
    release_args,
    scripts,
)
from .connection import AsyncConnection, HasAsyncConnection
from .handle import AsyncLockHandle, RenewEntry


class AsyncMultiLease(AsyncLockHandle):
    """Exclusive leases on several names, taken all or nothing, renewed in the heartbeat's
    one round trip, released together. ``token`` is the largest of the per-name fencing
    tokens and ``tokens`` maps each name to its own."""

    kind = "multi"

    def __init__(
        self, client: AsyncConnection | HasAsyncConnection, names: object, **options: Any
    ) -> None:
        checked = check_names(names)
        super().__init__(client, " + ".join(checked), **options)
        #: The names held, sorted.
        self.names = tuple(checked)
        #: The Redis keys of each name, in key order (and the names in that order).
        self.keys, self._ordered = key_order(self._conn.prefix, checked)
        # Woken by a release of any of the names.
        self._channels = tuple(keys.channel for keys in self.keys)
        self._tokens: dict[str, int] = {}

    @property
    def tokens(self) -> dict[str, int]:
        """The fencing token of each name (of the current or last acquisition)."""
        return dict(self._tokens)

    async def _try_acquire(self, owner: str, reserve: bool) -> tuple[bool, int]:
        # multi_acquire.lua: KEYS locks then fences.
        reply = await self._conn.script(
            scripts(self._conn).acquire,
            [k.lock for k in self.keys] + [k.fence for k in self.keys],
            acquire_args(
                owner, self._ttl_ms, self._max_hold_ms, reserve, self._ordered,
                self._describe_holder(named=False),
            ),
        )  # fmt: skip
        taken, value, tokens = acquired(self._ordered, reply)
        if taken:
            self._tokens = tokens
        return taken, value

    async def _release(self, owner: str, delay_ms: int) -> int:
        return int(
            await self._conn.script(
                scripts(self._conn).release,
                [k.lock for k in self.keys],
                release_args(owner, delay_ms, self.keys),
            )
        )

    @classmethod
    def _renew_script_call(cls, conn: AsyncConnection, entries: list[RenewEntry]) -> ScriptCall:
        # The same layout as the sync multi-lease: the handles carry the same _keys.
        return MultiLease._renew_script_call(conn, entries)  # type: ignore[arg-type]

    def _renew_units(self, owner: str, ttl_ms: int, gen: int) -> list[RenewUnit]:
        # A script may touch one slot only: each name is renewed as a lease is.
        return [(renew_lease_keys, k.lock, (k.lock, owner, ttl_ms, gen)) for k in self.keys]
