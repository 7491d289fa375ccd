"""Async multi-key locks: the operations of :class:`..kinds.multi.MultiLeaseOps` (the sync
:class:`..kinds.multi.MultiLease`'s: same keys and scripts, all names taken atomically by one
script, so no deadlock) awaited by the asyncio runner."""

from __future__ import annotations

from ..core.options import LockOptions, options_after_two
from ..kinds.multi import MultiLeaseOps
from .connection import AsyncConnection, HasAsyncConnection
from .handle import AsyncLockHandle


class AsyncMultiLease(MultiLeaseOps, AsyncLockHandle):
    """Exclusive leases on several names, taken all or nothing, renewed in the heartbeat's
    one round trip, released together. ``token`` is the largest of the per-name fencing
    tokens and ``tokens`` maps each name to its own."""

    @options_after_two(LockOptions["AsyncMultiLease"])
    def __init__(
        self,
        client: AsyncConnection | HasAsyncConnection,
        names: object,
        options: LockOptions[AsyncMultiLease],
    ) -> None:
        self._setup(client, names, options)
