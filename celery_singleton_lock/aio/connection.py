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
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

import redis
from redis.exceptions import RedisClusterException

from ..core import steps
from ..core.connection import ConnectionBase
from ..core.keys import DEFAULT_PREFIX
from ..core.layout import layout_call
from ..core.replication import Replication
from ..core.scripts import ScriptCall, Scripts
from ..exceptions import ConfigurationError
from .notifier import AsyncClusterNotifier, AsyncNotifier, Wakeup, async_notifier
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

    async def run(self, operation: steps.Steps[T], *, cancellable: bool = False) -> T:
        """Await an operation's steps (see :mod:`..core.steps`); its result. An error doing
        a step is thrown into the operation, which handles it or lets it go.

        ``cancellable`` (an acquire): redis-py can lose a cancellation that lands while a
        command is under way (the call returns its reply, or runs into the socket's timeout,
        instead). One asked for during the operation is thrown into it after the round trip,
        in place of the round trip's error if it had one (unless one reached it already: one
        is enough), where the acquire undoes what its attempts did. Any operation that ends
        with an error after a cancellation was asked for (a release, a change whose round trip
        then ran into the socket's timeout) raises it as the cancellation the caller asked
        for, the error its cause. The count of cancellations asked for is Python 3.11's;
        before it, none is noticed."""
        cancelling = getattr(asyncio.current_task(), "cancelling", None)
        asked = cancelling() if cancelling is not None else 0

        def cancel_asked() -> bool:  # since the operation began
            return cancelling is not None and cancelling() > asked

        watch = cancellable and cancelling is not None
        listening: AbstractAsyncContextManager[Wakeup] | None = None
        woken: Wakeup | None = None
        try:
            step = operation.send(None)
            while True:
                try:
                    if isinstance(step, steps.Pause):
                        if woken is not None:
                            await woken.wait(step.seconds)
                        else:
                            await asyncio.sleep(step.seconds)
                        result = None
                    elif isinstance(step, steps.Listen):
                        assert listening is None, step
                        entering = self.notifier().listening(step.channels)
                        woken = await entering.__aenter__()
                        listening, result = entering, None
                    else:
                        result = await self.do(step)
                    if watch and cancel_asked():
                        raise asyncio.CancelledError
                except BaseException as exc:
                    if watch and cancel_asked() and not isinstance(exc, asyncio.CancelledError):
                        # The step's error came after a cancellation redis-py lost: the
                        # operation is thrown the cancellation now, and not again in the
                        # middle of the undo this starts.
                        cancelled = asyncio.CancelledError()
                        cancelled.__cause__ = exc
                        exc = cancelled
                    if isinstance(exc, asyncio.CancelledError):
                        watch = False  # the operation has its cancellation: once is enough
                    step = operation.throw(exc)
                else:
                    step = operation.send(result)
        except StopIteration as done:
            value: T = done.value
            return value
        except BaseException as exc:
            if cancel_asked() and not isinstance(exc, asyncio.CancelledError):
                raise asyncio.CancelledError from exc
            raise
        finally:
            if listening is not None:
                await listening.__aexit__(None, None, None)

    async def do(self, step: steps.Step) -> Any:
        """One step that is a round trip (not a :class:`steps.Listen` or :class:`steps.Pause`); its
        reply. The layout check first where :meth:`needs_layout` says so (the layout script
        is a read: no WAIT)."""
        check = self.needs_layout(step)
        if check is not None:
            script, keys, args = layout_call(self, record=check.record)
            self.layout_checked_by(await self.call(run_script, self.redis, script, keys, args))
        if type(step) is tuple:
            return await self.script(*step)
        if isinstance(step, steps.Batch):
            return await self.batch(step.calls)
        if isinstance(step, steps.Command):
            return await self.call(step.of, self.redis)
        if isinstance(step, steps.Pipeline):
            return await self.call(step.run, self.redis)
        if isinstance(step, steps.Scan):
            return await self.call(_scanned, self.redis, step)
        if isinstance(step, steps.Blpop):
            return await self.call(self.redis.blpop, [step.key], step.timeout)
        assert isinstance(step, steps.CheckLayout), step
        return None

    async def server_time(self) -> float:
        """The Redis server's clock, in seconds since the epoch."""
        return await self.run(steps.server_seconds())

    async def server_ms(self) -> int:
        """The Redis server's clock in ms (the clock every lock time is written with)."""
        return await self.run(steps.server_ms())

    async def ping(self) -> bool:
        """True if Redis answers; raises :class:`LockBackendError` if not."""
        return bool(await self.call(self.redis.ping))

    async def close(self) -> None:
        """Stop the waiter listeners and close the connections: the client's, and for a
        Sentinel master client those to the sentinels it asks for the master (clients of
        their own, which closing it leaves open)."""
        for notifier in list(self._notifiers.values()):
            await notifier.close()
        self._notifiers.clear()
        await self.redis.aclose()
        manager = getattr(getattr(self.redis, "connection_pool", None), "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            await sentinel.aclose()


async def _scanned(redis: Any, scan: steps.Scan) -> list[bytes]:
    """The keys ``scan`` asks for, read with ``redis.asyncio``."""
    found: list[bytes] = []
    async for key in redis.scan_iter(match=scan.match, count=scan.count):
        found.append(key)
        if scan.limit is not None and len(found) >= scan.limit:
            break
    return found


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
