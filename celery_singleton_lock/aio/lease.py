"""The async exclusive lease: :class:`..lease.Lease` on ``redis.asyncio``, same keys and
scripts, so it excludes the sync lease and SingletonTask runs of the same name."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..core import validate
from ..core.handle_state import Outage, hint_seconds
from ..core.heartbeat import RenewUnit
from ..core.keys import lock_keys
from ..core.replies import AcquireReply
from ..core.scripts import (
    ScriptCall,
    acquire_call,
    fair_abandon_keys,
    fair_keys,
)
from ..exceptions import LockBackendError
from ..kinds.lease import (
    FAIR_REGISTRATION_MS,
    block_for,
    handed_token,
    packed_lease_holder,
    renew_lease_keys,
)
from .connection import AsyncConnection, HasAsyncConnection
from .handle import AsyncLockHandle, RenewEntry


class AsyncLease(AsyncLockHandle):
    """An exclusive, expiring lock on one name; made by :meth:`AsyncLockClient.lease`."""

    __slots__ = ("fair", "keys", "_channels", "_queued", "_queued_hint")

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
        fair: bool = False,
    ) -> None:
        """Options as for :meth:`AsyncLockClient.lease`."""
        super().__init__(
            client,
            name,
            ttl=ttl,
            heartbeat=heartbeat,
            max_hold=max_hold,
            wait=wait,
            owner_info=owner_info,
            on_lost=on_lost,
        )
        #: A blocked acquire queues, and a release hands the lease straight to the oldest
        #: live waiter (sync or async): first come, first served, and no second round trip.
        self.fair = validate.check_bool(fair, "fair")
        #: The Redis keys of this lease (lock hash, fencing counter, channel).
        self.keys = lock_keys(self._conn.prefix, self.name)
        self._channels = (self.keys.channel,)
        self._queued = ""  # the owner token a fair acquire waits in the queue with
        self._queued_hint = 0  # ms the last attempt said the holder's lease may still run

    def _new_owner(self) -> str:
        owner = self._queued = super()._new_owner()
        return owner

    async def _try_acquire(self, owner: str, reserve: bool) -> tuple[bool, int]:
        conn = self._conn
        keys = self.keys
        # No claim to take over (""): the async lease has no owner or take_over options.
        script_keys, args = acquire_call(
            keys.lock, keys.fence, owner, self._ttl_ms, self._max_hold_ms,
            packed_lease_holder(self.name, self.heartbeat, self.owner_info), "", reserve,
            FAIR_REGISTRATION_MS if reserve and self.fair else 0,
        )  # fmt: skip
        taken, value = await conn.script(conn.lease_scripts.acquire, script_keys, args)
        self._queued_hint = int(value)
        return taken == AcquireReply.ACQUIRED, int(value)

    async def _wait_for(
        self,
        attempt: Callable[[], Awaitable[tuple[bool, int]]],
        wait: float,
        abandon: Callable[[], Awaitable[None]],
    ) -> tuple[bool, int]:
        if not self.fair:
            return await super()._wait_for(attempt, wait, abandon)
        return await self._wait_in_queue(attempt, wait)

    async def _wait_in_queue(
        self, attempt: Callable[[], Awaitable[tuple[bool, int]]], wait: float
    ) -> tuple[bool, int]:
        """Block on this waiter's hand-off list, on a pooled connection, until a release
        hands it the lease; refresh the registration (and try the name) between blocks, as
        the sync lease does. A wait that runs out leaves the queue, and keeps a lease handed
        over meanwhile; a cancelled or failed one leaves it too (_undo_attempts)."""
        conn = self._conn
        owner = self._queued
        handed = fair_keys(self.keys.base, owner)[2]
        deadline = time.monotonic() + wait
        hint = hint_seconds(self._queued_hint)
        outage = Outage(deadline)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                reply = await conn.call(conn.redis.blpop, [handed], block_for(hint, remaining))
                token = handed_token(reply)
                if token:
                    return True, token
                taken, value = await attempt()
            except LockBackendError as error:
                await asyncio.sleep(outage.pause(error))  # see Outage
                continue
            outage.answered()
            if taken:
                return True, value
            hint = hint_seconds(value)
        try:
            token = await self._leave_queue(owner)
        except LockBackendError:
            self._withdraw_failed()
            return False, 0
        return (True, token) if token else (False, 0)

    async def _abandon(self, owner: str) -> None:
        # Cancelled or failed (see _undo_attempts, which then releases a lease handed over).
        if self.fair:
            await self._leave_queue(owner)

    async def _leave_queue(self, owner: str) -> int:
        """Withdraw from the queue; the token if a release handed the lease over meanwhile
        (this waiter then holds it)."""
        conn = self._conn
        keys = fair_abandon_keys(self.keys.lock, owner)
        return int(await conn.script(conn.lease_scripts.fair_abandon, keys, (owner,)))

    async def _release(self, owner: str, delay_ms: int) -> int:
        conn = self._conn
        return int(
            await conn.script(
                conn.lease_scripts.release,
                (self.keys.lock,),
                (owner, delay_ms),
            )
        )

    @classmethod
    def _renew_script_call(cls, conn: AsyncConnection, entries: list[RenewEntry]) -> ScriptCall:
        return conn.scripts.renew_call(
            [(lease.keys.lock, owner, ttl_ms, gen) for lease, owner, ttl_ms, gen in entries]
        )

    def _renew_units(self, owner: str, ttl_ms: int, gen: int) -> list[RenewUnit]:
        return [(renew_lease_keys, self.keys.lock, (self.keys.lock, owner, ttl_ms, gen))]
