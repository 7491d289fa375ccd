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

from ..core.connection import ConnectionBase, clock_ms, clock_seconds
from ..core.keys import DEFAULT_PREFIX
from ..core.layout import check_reply, layout_call
from ..core.replication import Replication
from ..core.scripts import ScriptCall, Scripts
from ..exceptions import ConfigurationError
from .notifier import AsyncClusterNotifier, AsyncNotifier, async_notifier
from .scripts import run_batch, run_script

T = TypeVar("T")


class AsyncConnection(ConnectionBase):
    """A ``redis.asyncio`` client, the key ``prefix`` of every lock on it, and what the
    handles need from it: ``keys(name)``, ``call(fn, ...)``, the scripts, the waiter
    listener of the running loop and the server's clock."""

    def __init__(
        self,
        redis_client: Any,
        prefix: str = DEFAULT_PREFIX,
        replication: Replication | None = None,
    ) -> None:
        super().__init__(redis_client, prefix)
        #: How many replicas a lock's writes wait for (None: none), see
        #: :mod:`..core.replication`: every script call and batch then carries its WAIT.
        self.replication = replication
        # Only computes SHAs here: the scripts are sent by SHA, see scripts.py.
        #: The sync core's scripts: the handles build their lease calls (and the heartbeat
        #: its renew calls) with them, as the sync handles do.
        self.scripts = Scripts(redis_client)
        self._notifiers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, AsyncNotifier | AsyncClusterNotifier
        ] = weakref.WeakKeyDictionary()

    @staticmethod
    def check_client(redis_client: Any) -> None:
        execute = getattr(type(redis_client), "execute_command", None)
        if not hasattr(redis_client, "register_script") or not inspect.iscoroutinefunction(execute):
            raise ConfigurationError(
                "redis_client",
                f"must be a redis.asyncio client, got {type(redis_client).__name__}",
            )

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
            raise self.backend_error(exc) from exc

    async def script(self, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """One script call by SHA (loaded on NOSCRIPT); with ``replication``, followed by its
        WAIT in the same round trip (:class:`LockNotReplicated` if not acknowledged)."""
        if self.replication is not None:
            (reply,) = await self.batch([(script, keys, args)])
            return reply
        return await self.call(run_script, self.redis, script, keys, args)

    async def batch(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Script calls in one round trip; their replies in order. With ``replication``,
        the round trip ends with the WAIT (:func:`.scripts.run_batch`)."""
        return await self.call(run_batch, self.redis, calls, self.replication)

    async def check_layout(self, *, record: bool = True) -> None:
        """Record this process's key layout versions under the prefix where none are (not
        without ``record``: a listing's read), and raise :class:`KeyLayoutError` if those
        recorded differ (core/layout.py); nothing once they were found equal on this
        connection."""
        if self.layout_checked:
            return
        script, keys, args = layout_call(self, record=record)
        reply = await self.call(run_script, self.redis, script, keys, args)
        self.layout_checked = check_reply(reply, self.prefix, self.url)

    async def server_time(self) -> float:
        """The Redis server's clock, in seconds since the epoch."""
        return clock_seconds(await self.call(self.redis.time))

    async def server_ms(self) -> int:
        """The Redis server's clock in ms (the clock every lock time is written with)."""
        return clock_ms(await self.call(self.redis.time))

    async def ping(self) -> bool:
        """True if Redis answers; raises :class:`LockBackendError` if not."""
        return bool(await self.call(self.redis.ping))

    async def close(self) -> None:
        """Stop the waiter listeners and close the connections."""
        for notifier in list(self._notifiers.values()):
            await notifier.close()
        self._notifiers.clear()
        await self.redis.aclose()


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
