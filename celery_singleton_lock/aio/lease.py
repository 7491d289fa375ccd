"""The async exclusive lease: :class:`..lease.Lease` on ``redis.asyncio``, same keys and
scripts, so it excludes the sync lease and SingletonTask runs of the same name."""

from __future__ import annotations

from typing import Any

from ..core.scripts import ScriptCall, pack_holder
from .connection import AsyncConnection, HasAsyncConnection
from .handle import AsyncLockHandle, RenewEntry


class AsyncLease(AsyncLockHandle):
    """An exclusive, expiring lock on one name; made by :meth:`AsyncLockClient.lease`."""

    kind = "lease"

    def __init__(
        self, client: AsyncConnection | HasAsyncConnection, name: str, **options: Any
    ) -> None:
        """Options as for :meth:`AsyncLockClient.lease`."""
        super().__init__(client, name, **options)
        self._keys = self._conn.keys(self.name)
        self._channels = (self._keys.channel,)

    async def _try_acquire(self, owner: str, reserve: bool) -> tuple[bool, int]:
        conn = self._conn
        keys = self._keys
        # acquire.lua: ARGV owner, ttl, max-hold, takeover ('' none), wait mode ('1': a
        # waiter, whose failed attempt marks the holder so its release publishes), fair
        # registration ms (unused here), the holder's fields packed
        taken, value = await conn.script(
            conn.lease_scripts.acquire,
            (keys.lock, keys.fence),
            (
                owner, self._ttl_ms, self._max_hold_ms, "", "1" if reserve else "", 0,
                pack_holder(self._describe_holder()),
            ),
        )  # fmt: skip
        return bool(taken), int(value)

    async def _release(self, owner: str, delay_ms: int) -> int:
        conn = self._conn
        return int(
            await conn.script(
                conn.lease_scripts.release,
                (self._keys.lock,),
                (owner, delay_ms),
            )
        )

    @classmethod
    def _renew_script_call(cls, conn: AsyncConnection, entries: list[RenewEntry]) -> ScriptCall:
        return conn.scripts.renew_call(
            [(lease._keys.lock, owner, ttl_ms) for lease, owner, ttl_ms in entries]
        )
