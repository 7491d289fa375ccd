"""AsyncLockClient: the lock core on ``redis.asyncio``, for web handlers (FastAPI, Django
async views) that take or inspect the same locks Celery tasks hold."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..admin import LockInfo
from ..client import bad_url, check_url
from ..core import redis_urls, validate
from ..core.keys import DEFAULT_PREFIX
from ..exceptions import ConfigurationError
from ..kinds.lease import release_holder_args
from . import admin
from .connection import AsyncConnection
from .intervals import AsyncRangeLock, AsyncRWLock
from .lease import AsyncLease
from .multi import AsyncMultiLease
from .semaphore import AsyncSemaphore


class AsyncLockClient:
    """Entry point of the asyncio lock core: wraps a ``redis.asyncio`` client and makes locks.

    The same keys, scripts and guarantees as :class:`LockClient`: an async lease excludes a
    sync lease and a SingletonTask run of the same name, and fencing tokens increase across
    all of them. ``prefix`` namespaces every key.

    >>> client = AsyncLockClient.from_url("redis://localhost:6379/0")
    >>> async with client.lease("nightly-report", ttl=30, wait=5) as lease:
    ...     await write_report(fencing_token=lease.token)
    """

    def __init__(self, redis_client: Any, *, prefix: str = DEFAULT_PREFIX) -> None:
        #: What the handles and the admin functions work through.
        self.connection = AsyncConnection(redis_client, prefix)

    @property
    def redis(self) -> Any:
        """The ``redis.asyncio`` client."""
        return self.connection.redis

    @property
    def prefix(self) -> str:
        """The key prefix of every lock of this client."""
        return self.connection.prefix

    @property
    def url(self) -> str:
        """The server, with no password."""
        return self.connection.url

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = DEFAULT_PREFIX, **redis_kwargs: Any
    ) -> AsyncLockClient:
        """A client for the Redis at ``url``: ``redis://``, ``rediss://``, ``unix://``, a
        Cluster (``redis+cluster://host:port,...``) or Sentinel
        (``sentinel://host:port,.../master-name``), read as :meth:`LockClient.from_url` reads
        it; extra keyword arguments go to the ``redis.asyncio`` client. No I/O until the first
        lock call."""
        url = check_url(url, redis_kwargs)
        validate.check_prefix(prefix)
        try:
            client = redis_urls.connect_async(url, **redis_kwargs)
        except ValueError as exc:
            raise bad_url(url, exc) from None
        return cls(client, prefix=prefix)

    def lease(
        self,
        name: str,
        *,
        ttl: float = 30.0,
        heartbeat: bool = True,
        max_hold: float | None = None,
        wait: float = 0.0,
        owner_info: dict[str, Any] | None = None,
        on_lost: Callable[[AsyncLease], object] | None = None,
        fair: bool = False,
    ) -> AsyncLease:
        """An exclusive lease on ``name`` (not yet acquired); options as
        :meth:`LockClient.lease`. ``on_lost`` may be a plain or a coroutine function."""
        return AsyncLease(
            self.connection,
            name,
            fair=fair,
            ttl=ttl,
            heartbeat=heartbeat,
            max_hold=max_hold,
            wait=wait,
            owner_info=owner_info,
            on_lost=on_lost,
        )

    def rwlock(self, name: str) -> AsyncRWLock:
        """A reader-writer lock on ``name``: ``.read()``, ``.upgradable()``, ``.write()``."""
        return AsyncRWLock(self.connection, name)

    def range_lock(self, name: str) -> AsyncRangeLock:
        """A range lock on ``name``: ``.read(lo, hi)``, ``.upgradable(lo, hi)``,
        ``.write(lo, hi)``."""
        return AsyncRangeLock(self.connection, name)

    def semaphore(self, name: str, limit: int) -> AsyncSemaphore:
        """A counting semaphore on ``name``: at most ``limit`` (an int >= 1) permits held at
        once; ``.permit()`` makes one. Shares its permits with :meth:`LockClient.semaphore`."""
        return AsyncSemaphore(self.connection, name, limit)

    def multi(
        self,
        names: Iterable[str],
        *,
        ttl: float = 30.0,
        heartbeat: bool = True,
        max_hold: float | None = None,
        wait: float = 0.0,
        owner_info: dict[str, Any] | None = None,
        on_lost: Callable[[AsyncMultiLease], object] | None = None,
    ) -> AsyncMultiLease:
        """Exclusive leases on all of ``names``, taken all or nothing (not yet acquired)."""
        return AsyncMultiLease(
            self.connection,
            names,
            ttl=ttl,
            heartbeat=heartbeat,
            max_hold=max_hold,
            wait=wait,
            owner_info=owner_info,
            on_lost=on_lost,
        )

    async def release_holder(
        self,
        name: str,
        *,
        task_id: str,
        pid: int,
        host: str | None = None,
        delay: float = 0.0,
    ) -> bool:
        """Release lease ``name`` (after a release delay of ``delay`` seconds) if task ``task_id``
        running in process ``pid`` on ``host`` (default: this machine) holds it, as
        :meth:`LockClient.release_holder`. True if released."""
        conn = self.connection
        keys = conn.keys(name)
        args = release_holder_args(task_id, pid, host, delay, keys.channel)
        return bool(await conn.script(conn.lease_scripts.release_holder, [keys.lock], args))

    async def locks(self, pattern: str | None = None) -> list[LockInfo]:
        """Every lock under this client's prefix whose name matches the glob ``pattern``,
        with its holder and whether it is live, stale or in a release delay (docs/admin.md)."""
        if pattern is not None:
            validate.check_name(pattern, "pattern")
        return await admin.list_locks(self.connection, pattern)

    async def clear(self, name: str, *, token: int | None = None, force: bool = False) -> bool:
        """Clear lock ``name`` (only its holder with fencing ``token``, if given): atomic and
        holder-checked. A live lock is cleared only with ``force``, else :class:`LockError`.
        True if something was cleared."""
        validate.check_name(name)
        if token is not None and (isinstance(token, bool) or not isinstance(token, int)):
            raise ConfigurationError("token", f"must be an int or None, got {token!r}")
        validate.check_bool(force, "force")
        return await admin.clear(self.connection, name, token=token, force=force)

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

    def __repr__(self) -> str:
        return f"<AsyncLockClient {self.url} prefix={self.prefix!r}>"
