"""The connection every async lock handle works through: one ``redis.asyncio`` client under
one key prefix, with its scripts, its waiter listeners (one per event loop), the server's
clock, and the mapping of Redis errors to the package's.

:class:`AsyncLockClient` (client.py) is a facade over an :class:`AsyncConnection`; the async
handles and the admin functions take the connection, so nothing else in ``aio`` imports the
client. They still accept an ``AsyncLockClient``: :func:`async_connection_of` reads its
``connection``.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import redis
from redis.exceptions import RedisClusterException

from ..core import redis_urls, validate
from ..core.keys import DEFAULT_PREFIX, LockKeys, lock_keys
from ..core.scripts import ScriptCall, Scripts
from ..exceptions import ConfigurationError, LockBackendError
from .notifier import AsyncClusterNotifier, AsyncNotifier, async_notifier
from .scripts import LeaseScripts, run_batch, run_script

T = TypeVar("T")


class AsyncConnection:
    """A ``redis.asyncio`` client, the key ``prefix`` of every lock on it, and what the
    handles need from it: ``keys(name)``, ``call(fn, ...)``, the scripts, the waiter
    listener of the running loop and the server's clock."""

    def __init__(self, redis_client: Any, prefix: str = DEFAULT_PREFIX) -> None:
        validate.check_prefix(prefix)
        execute = getattr(type(redis_client), "execute_command", None)
        if not hasattr(redis_client, "register_script") or not inspect.iscoroutinefunction(execute):
            raise ConfigurationError(
                "redis_client",
                f"must be a redis.asyncio client, got {type(redis_client).__name__}",
            )
        self.redis = redis_client
        self.prefix = prefix
        #: The server, with no password: what error messages name.
        self.url = redis_urls.safe_url(redis_client)
        # Both only compute SHAs here: the scripts are sent by SHA, see scripts.py.
        #: The sync core's scripts: the renew call's layout is shared with the sync handles.
        self.scripts = Scripts(redis_client)
        self.lease_scripts = LeaseScripts(redis_client)
        self._notifiers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, AsyncNotifier | AsyncClusterNotifier
        ] = weakref.WeakKeyDictionary()

    @property
    def _scripts(self) -> Scripts:
        # The sync heartbeat's renew_calls, which the async heartbeat reuses, reads this name.
        return self.scripts

    def keys(self, name: str) -> LockKeys:
        """The Redis keys of lock ``name`` (checked) under this prefix."""
        return lock_keys(self.prefix, validate.check_name(name))

    def notifier(self) -> AsyncNotifier | AsyncClusterNotifier:
        """The waiter listener of the running event loop."""
        loop = asyncio.get_running_loop()
        notifier = self._notifiers.get(loop)
        if notifier is None:
            notifier = self._notifiers[loop] = async_notifier(self.redis)
        return notifier

    async def call(self, function: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Await one Redis operation; Redis failures become :class:`LockBackendError`."""
        try:
            return await function(*args)
        except (redis.RedisError, RedisClusterException, OSError) as exc:
            raise LockBackendError(f"Redis at {self.url}: {exc}") from exc

    async def script(self, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """One script call by SHA (loaded on NOSCRIPT)."""
        return await self.call(run_script, self.redis, script, keys, args)

    async def batch(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Script calls in one round trip; their replies in order."""
        return await self.call(run_batch, self.redis, calls)

    async def server_time(self) -> float:
        """The Redis server's clock, in seconds since the epoch."""
        seconds, micros = await self._server_clock()
        return seconds + micros / 1_000_000

    async def server_ms(self) -> int:
        """The Redis server's clock in ms (the clock every lock time is written with)."""
        seconds, micros = await self._server_clock()
        return seconds * 1000 + micros // 1000

    async def _server_clock(self) -> tuple[int, int]:
        seconds, micros = await self.call(self.redis.time)
        return int(seconds), int(micros)

    async def ping(self) -> bool:
        """True if Redis answers; raises :class:`LockBackendError` if not."""
        return bool(await self.call(self.redis.ping))

    async def close(self) -> None:
        """Stop the waiter listeners and close the connections."""
        for notifier in list(self._notifiers.values()):
            await notifier.close()
        self._notifiers.clear()
        # aclose() since redis-py 5.0.1; close() before it (deprecated after).
        close = getattr(self.redis, "aclose", None) or self.redis.close
        await close()

    def __repr__(self) -> str:
        return f"<AsyncConnection {self.url} prefix={self.prefix!r}>"


class HasAsyncConnection(Protocol):
    """What owns an :class:`AsyncConnection` (an ``AsyncLockClient``)."""

    @property
    def connection(self) -> AsyncConnection: ...


def async_connection_of(source: AsyncConnection | HasAsyncConnection) -> AsyncConnection:
    """The AsyncConnection of ``source``: itself, or its ``connection`` (an
    ``AsyncLockClient``)."""
    if isinstance(source, AsyncConnection):
        return source
    return source.connection
