"""The async exclusive lease: the operations of :class:`..kinds.lease.LeaseOps` (the sync
:class:`..kinds.lease.Lease`'s, same keys and scripts, so it excludes the sync lease and
SingletonTask runs of the same name) awaited by the asyncio runner."""

from __future__ import annotations

from ..core.options import FairOptions, options_after_two
from ..kinds.lease import LEASE_SLOTS, LeaseOps
from .connection import AsyncConnection, HasAsyncConnection
from .handle import AsyncLockHandle


class AsyncLease(LeaseOps, AsyncLockHandle):
    """An exclusive, expiring lock on one name; made by :meth:`AsyncLockClient.lease`."""

    __slots__ = LEASE_SLOTS

    @options_after_two(FairOptions["AsyncLease"])
    def __init__(
        self,
        client: AsyncConnection | HasAsyncConnection,
        name: str,
        options: FairOptions[AsyncLease],
    ) -> None:
        """Options as for :meth:`AsyncLockClient.lease`: ``fair``, a blocked acquire queues
        and a release hands the lease straight to the oldest live waiter (sync or async).
        No ``owner`` or ``take_over``: the async lease holds under a fresh owner token."""
        self._setup(client, name, options)
