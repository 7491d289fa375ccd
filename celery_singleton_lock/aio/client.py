"""AsyncLockClient: the lock core on ``redis.asyncio``, for web handlers (FastAPI, Django
async views) that take or inspect the same locks Celery tasks hold."""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.exceptions import RedisClusterException

from ..admin import LockInfo
from ..client import DEFAULT_SOCKET_TIMEOUT, mask_password
from ..core import redis_urls, validate
from ..core.keys import DEFAULT_PREFIX, LockKeys, lock_keys
from ..core.scripts import Scripts
from ..exceptions import ConfigurationError, LockBackendError
from . import admin
from .intervals import AsyncRangeLock, AsyncRWLock
from .lease import AsyncLease
from .multi import AsyncMultiLease
from .notifier import AsyncNotifier
from .scripts import LeaseScripts, run_script

T = TypeVar("T")

#: URL schemes the asyncio client does not take yet (pass a ``redis.asyncio`` client made
#: your own way instead, e.g. ``redis.asyncio.sentinel.Sentinel(...).master_for(name)``).
UNSUPPORTED_SCHEMES = (*redis_urls.CLUSTER_SCHEMES, *redis_urls.SENTINEL_SCHEMES)


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
        validate.check_prefix(prefix)
        execute = getattr(type(redis_client), "execute_command", None)
        if not hasattr(redis_client, "register_script") or not inspect.iscoroutinefunction(execute):
            raise ConfigurationError(
                "redis_client",
                f"must be a redis.asyncio client, got {type(redis_client).__name__}",
            )
        self.redis = redis_client
        self.prefix = prefix
        self.url = redis_urls.safe_url(redis_client)
        # Both only compute SHAs here: the scripts are sent by SHA, see scripts.py.
        self._scripts = Scripts(redis_client)  # the renew call's layout, shared with the sync
        self._lease_scripts = LeaseScripts(redis_client)
        self._notifiers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncNotifier] = (
            weakref.WeakKeyDictionary()
        )

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = DEFAULT_PREFIX, **redis_kwargs: Any
    ) -> AsyncLockClient:
        """A client for the Redis at ``url`` (``redis://``, ``rediss://``, ``unix://``);
        extra keyword arguments go to ``redis.asyncio.Redis.from_url``. No I/O until the
        first lock call."""
        if not isinstance(url, str) or not url:
            raise ConfigurationError("url", f"must be a non-empty str, got {url!r}")
        validate.check_prefix(prefix)
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        if scheme in UNSUPPORTED_SCHEMES:
            raise ConfigurationError(
                "url",
                f"{mask_password(url)}: {scheme}:// is not supported by AsyncLockClient yet;"
                " pass a redis.asyncio client instead (docs/asyncio.md)",
            )
        # As LockClient.from_url: a Redis that stops answering must not block the
        # heartbeat task, which renews every lease of the loop, for ever.
        redis_kwargs.setdefault("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
        redis_kwargs.setdefault("socket_connect_timeout", DEFAULT_SOCKET_TIMEOUT)
        try:
            client = redis.asyncio.Redis.from_url(url, **redis_kwargs)
        except ValueError as exc:
            raise ConfigurationError("url", f"{mask_password(url)}: {exc}") from None
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
    ) -> AsyncLease:
        """An exclusive lease on ``name`` (not yet acquired); options as
        :meth:`LockClient.lease`. ``on_lost`` may be a plain or a coroutine function."""
        return AsyncLease(
            self,
            name,
            ttl=ttl,
            heartbeat=heartbeat,
            max_hold=max_hold,
            wait=wait,
            owner_info=owner_info,
            on_lost=on_lost,
        )

    def rwlock(self, name: str) -> AsyncRWLock:
        """A reader-writer lock on ``name``: ``.read()``, ``.upgradable()``, ``.write()``."""
        return AsyncRWLock(self, name)

    def range_lock(self, name: str) -> AsyncRangeLock:
        """A range lock on ``name``: ``.read(lo, hi)``, ``.upgradable(lo, hi)``,
        ``.write(lo, hi)``."""
        return AsyncRangeLock(self, name)

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
            self,
            names,
            ttl=ttl,
            heartbeat=heartbeat,
            max_hold=max_hold,
            wait=wait,
            owner_info=owner_info,
            on_lost=on_lost,
        )

    async def locks(self, pattern: str | None = None) -> list[LockInfo]:
        """Every lock under this client's prefix whose name matches the glob ``pattern``,
        with its holder and whether it is live, stale or in delay-after (docs/admin.md)."""
        if pattern is not None:
            validate.check_name(pattern, "pattern")
        return await admin.list_locks(self, pattern)

    async def clear(self, name: str, *, token: int | None = None, force: bool = False) -> bool:
        """Clear lock ``name`` (only its holder with fencing ``token``, if given): atomic and
        holder-checked. A live lock is cleared only with ``force``, else :class:`LockError`.
        True if something was cleared."""
        validate.check_name(name)
        if token is not None and (isinstance(token, bool) or not isinstance(token, int)):
            raise ConfigurationError("token", f"must be an int or None, got {token!r}")
        validate.check_bool(force, "force")
        return await admin.clear(self, name, token=token, force=force)

    async def server_time(self) -> float:
        """The Redis server's clock, in seconds since the epoch."""
        seconds, micros = await self._server_clock()
        return seconds + micros / 1_000_000

    async def server_ms(self) -> int:
        """The Redis server's clock in ms (the clock every lock time is written with)."""
        seconds, micros = await self._server_clock()
        return seconds * 1000 + micros // 1000

    async def _server_clock(self) -> tuple[int, int]:
        seconds, micros = await self._call(self.redis.time)
        return int(seconds), int(micros)

    async def ping(self) -> bool:
        """True if Redis answers; raises :class:`LockBackendError` if not."""
        return bool(await self._call(self.redis.ping))

    async def close(self) -> None:
        """Stop this client's waiter listeners and close its connections."""
        for notifier in list(self._notifiers.values()):
            await notifier.close()
        self._notifiers.clear()
        # aclose() since redis-py 5.0.1; close() before it (deprecated after).
        close = getattr(self.redis, "aclose", None) or self.redis.close
        await close()

    def __repr__(self) -> str:
        return f"<AsyncLockClient {self.url} prefix={self.prefix!r}>"

    # -- internals shared by the handles -----------------------------------------------------

    def _keys(self, name: str) -> LockKeys:
        return lock_keys(self.prefix, validate.check_name(name))

    def _notifier(self) -> AsyncNotifier:
        """The waiter listener of the running event loop."""
        loop = asyncio.get_running_loop()
        notifier = self._notifiers.get(loop)
        if notifier is None:
            notifier = self._notifiers[loop] = AsyncNotifier(self.redis)
        return notifier

    async def _call(self, function: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Await one Redis operation; Redis failures become :class:`LockBackendError`."""
        try:
            return await function(*args)
        except (redis.RedisError, RedisClusterException, OSError) as exc:
            raise LockBackendError(f"Redis at {self.url}: {exc}") from exc

    async def _script(self, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """One script call by SHA (loaded on NOSCRIPT)."""
        return await self._call(run_script, self.redis, script, keys, args)
