"""The async exclusive lease: the operations of :class:`..kinds.lease.LeaseOps` (the sync
:class:`..kinds.lease.Lease`'s, same keys and scripts, so it excludes the sync lease and
SingletonTask runs of the same name) awaited by the asyncio runner."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import validate
from ..kinds.lease import LEASE_SLOTS, LeaseOps
from .connection import AsyncConnection, HasAsyncConnection
from .handle import AsyncLockHandle


class AsyncLease(LeaseOps, AsyncLockHandle):
    """An exclusive, expiring lock on one name; made by :meth:`AsyncLockClient.lease`."""

    __slots__ = LEASE_SLOTS

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
        """Options as for :meth:`AsyncLockClient.lease`: ``fair``, a blocked acquire queues
        and a release hands the lease straight to the oldest live waiter (sync or async)."""
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
        fair = validate.check_bool(fair, "fair")
        # No owner or take_over options: the async lease holds under a fresh owner token.
        self._init_lease(fair, None, None)
