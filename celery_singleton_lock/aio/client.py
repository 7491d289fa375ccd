"""AsyncLockClient: the lock core on ``redis.asyncio``, for web handlers (FastAPI, Django
async views) that take or inspect the same locks Celery tasks hold."""

from __future__ import annotations

from ..admin import Listing
from ..admin.clear import name_cleared
from ..admin.inspect import listing
from ..core import redis_urls
from ..core.client_base import ClientBase
from ..core.handle import HolderRecord
from ..core.options import FairOptions, ProcessOptions, options_after
from ..kinds.lease import holder_released
from ..kinds.lease_listing import lease_holders_read
from .connection import AsyncConnection
from .lease import AsyncLease
from .multi import AsyncMultiLease
from .rwlock import AsyncRangeLock, AsyncRWLock
from .semaphore import AsyncSemaphore


class AsyncLockClient(
    ClientBase[AsyncConnection, AsyncRWLock, AsyncRangeLock, AsyncSemaphore, AsyncMultiLease]
):
    """Entry point of the asyncio lock core: wraps a ``redis.asyncio`` client and makes locks.

    The same keys, scripts and guarantees as :class:`LockClient`: an async lease excludes a
    sync lease and a SingletonTask run of the same name, and fencing tokens increase across
    all of them. ``prefix`` namespaces every key.

    ``replicas`` N > 0: every lock write (acquire, renewal, release, upgrade, clear) reports
    success only once N replicas acknowledged it (``WAIT N``, in the same round trip), the
    master waiting at most ``replica_timeout`` seconds, as for :class:`LockClient`; see
    docs/deployment.md, "Replicated locks".

    >>> client = AsyncLockClient.from_url("redis://localhost:6379/0")
    >>> async with client.lease("nightly-report", ttl=30, wait=5) as lease:
    ...     await write_report(fencing_token=lease.token)
    """

    _connection_type = AsyncConnection
    _connect = staticmethod(redis_urls.connect_async)
    _rwlock_type = AsyncRWLock
    _range_lock_type = AsyncRangeLock
    _semaphore_type = AsyncSemaphore
    _multi_type = AsyncMultiLease

    @options_after(FairOptions[AsyncLease])
    def lease(self, name: str, options: FairOptions[AsyncLease]) -> AsyncLease:
        """An exclusive lease on ``name`` (not yet acquired); options as
        :meth:`LockClient.lease` (but ``owner`` and ``take_over``). ``on_lost`` may be a
        plain or a coroutine function."""
        return AsyncLease.made(self.connection, name, options)

    @options_after(ProcessOptions)
    async def release_holder(self, name: str, process: ProcessOptions) -> bool:
        """Release lease ``name`` (after a release delay of ``delay`` seconds) if task ``task_id``
        running in process ``pid`` on ``host`` (default: this machine) holds it, as
        :meth:`LockClient.release_holder`. True if released."""
        return await self.connection.run(holder_released(self.connection, name, process))

    async def holders(self, name: str) -> list[HolderRecord]:
        """Who holds lease ``name`` now, as :meth:`LockClient.holders`."""
        return await self.connection.run(lease_holders_read([self.connection.keys(name).lock]))

    async def locks(self, pattern: str | None = None) -> Listing:
        """Every lock under this client's prefix whose name matches the glob ``pattern``,
        with its holder and whether it is live, stale or in a release delay (docs/admin.md);
        its ``skipped`` counts the keys of another type passed by."""
        return await self.connection.run(listing(self.prefix, pattern))

    async def clear(self, name: str, *, token: int | None = None, force: bool = False) -> bool:
        """Clear lock ``name`` (only its holder with fencing ``token``, if given): atomic and
        holder-checked. A live lock is cleared only with ``force``, else :class:`LockError`.
        True if something was cleared."""
        return await self.connection.run(name_cleared(self.connection, name, token, force))

    async def server_time(self) -> float:
        """The Redis server's clock, in seconds since the epoch."""
        return await self.connection.server_time()

    async def server_ms(self) -> int:
        """The Redis server's clock in ms (the clock every lock time is written with)."""
        return await self.connection.server_ms()

    async def ping(self) -> bool:
        """True if Redis answers; raises :class:`LockBackendError` if not."""
        return await self.connection.ping()

    async def close(self) -> None:
        """Stop this client's waiter listeners and close its connections."""
        await self.connection.close()
