"""Async counting semaphores: the permits of :mod:`..kinds.semaphore` (same keys, same
scripts, the same operations) awaited by the asyncio runner, so sync and async holders of
one name share its permits."""

from __future__ import annotations

import math
from typing import Any

from ..kinds.semaphore import PermitOps, SemaphoreMaker, check_limit
from .connection import AsyncConnection, HasAsyncConnection, async_connection_of
from .rwlock import AsyncIntervalHandle


class AsyncPermit(PermitOps, AsyncIntervalHandle):
    """One permit of a semaphore, awaited: ``await permit.acquire()``, ``async with``."""

    def __init__(
        self, client: AsyncConnection | HasAsyncConnection, name: str, limit: int, **options: Any
    ) -> None:
        self.limit = check_limit(limit)
        super().__init__(client, name, "r", -math.inf, math.inf, **options)


class AsyncSemaphore(SemaphoreMaker[AsyncPermit]):
    """A counting semaphore on one name: at most ``limit`` permits held at once; makes
    permits (not yet acquired) with the options of :meth:`AsyncLockClient.lease`."""

    def __init__(self, client: AsyncConnection | HasAsyncConnection, name: str, limit: int) -> None:
        super().__init__(name, limit, async_connection_of(client), AsyncPermit)
