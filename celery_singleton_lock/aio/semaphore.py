"""Async counting semaphores: the permits of :mod:`..kinds.semaphore` (same keys, same
scripts) with awaitable round trips, so sync and async holders of one name share its
permits."""

from __future__ import annotations

import math
from typing import Any

from ..core import validate
from ..core.scripts import bound_to
from ..kinds.semaphore import PermitHold, SemaphoreScripts, check_limit
from .connection import AsyncConnection, HasAsyncConnection, async_connection_of
from .intervals import AsyncIntervalHandle


class AsyncPermit(PermitHold, AsyncIntervalHandle):
    """One permit of a semaphore, awaited: ``await permit.acquire()``, ``async with``."""

    def __init__(
        self, client: AsyncConnection | HasAsyncConnection, name: str, limit: int, **options: Any
    ) -> None:
        self.limit = check_limit(limit)
        super().__init__(client, name, "r", -math.inf, math.inf, **options)

    async def _try_acquire(self, owner: str, reserve: bool) -> tuple[bool, int]:
        keys, args = self._permit_call(owner, reserve)
        script = bound_to(self._conn, SemaphoreScripts).acquire
        return self._permit_acquired(await self._conn.script(script, keys, args))


class AsyncSemaphore:
    """A counting semaphore on one name: at most ``limit`` permits held at once; makes
    permits (not yet acquired) with the options of :meth:`AsyncLockClient.lease`."""

    def __init__(self, client: AsyncConnection | HasAsyncConnection, name: str, limit: int) -> None:
        self.limit = check_limit(limit)
        self.name = validate.check_name(name)
        self._conn = async_connection_of(client)

    def permit(self, **options: Any) -> AsyncPermit:
        """One permit (not yet acquired)."""
        return AsyncPermit(self._conn, self.name, self.limit, **options)

    def __repr__(self) -> str:
        return f"<AsyncSemaphore {self.name!r} limit={self.limit}>"
