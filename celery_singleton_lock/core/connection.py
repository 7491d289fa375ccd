"""The connection every lock handle works through: one redis-py client under one key prefix,
with its scripts, its release notifier, and the mapping of Redis errors to the package's.

:class:`LockClient` (client.py) is a facade over a :class:`Connection`; the lock kinds and
the admin functions take the Connection, so nothing below the front ends imports the client.
They still accept a ``LockClient`` (``Lease(client, name)`` is public): :func:`connection_of`
reads its ``connection``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

import redis
from redis.exceptions import RedisClusterException

from ..exceptions import ConfigurationError, LockBackendError
from . import redis_urls, steps, validate
from .auth_errors import auth_message, is_auth_error
from .keys import LockKeys, lock_keys
from .layout import RECHECK_S, check_reply, layout_call
from .notifier import Wakeup, notifier_for
from .replication import Replication
from .scripts import Scripts, run_batch

T = TypeVar("T")


def check_undecoded(redis_client: Any) -> None:
    """ConfigurationError if ``redis_client`` decodes its replies (``decode_responses=True``):
    a lock's hash keeps binary fields (the packed holder record, core/holder.py), which such
    a client cannot read, so listing, clearing and the Celery layer's checks of its own holds
    would fail with UnicodeDecodeError; this says so before any lock is taken."""
    get_encoder = getattr(redis_client, "get_encoder", None)
    if get_encoder is not None and get_encoder().decode_responses:
        raise ConfigurationError(
            "redis_client",
            "must not decode responses (it was made with decode_responses=True): lock hashes "
            "keep binary fields; pass a client made without it (a separate one for the "
            "locks, or redis.Redis(connection_pool=...) on a pool of your own)",
        )


class ConnectionBase:
    """What the sync and the asyncio connection share: a redis-py client (checked by
    ``check_client``), the key ``prefix`` of every lock on it, and the keys of a lock."""

    def __init__(self, redis_client: Any, prefix: str) -> None:
        validate.check_prefix(prefix)
        self.check_client(redis_client)
        check_undecoded(redis_client)
        self.redis = redis_client
        self.prefix = prefix
        #: The server(s), with no password: what error messages name.
        self.url = redis_urls.safe_url(redis_client)
        #: What a configuration error calls the URL: the argument, or the setting it came
        #: from (a Celery app's ``singleton_lock_url``), so the message names what to fix.
        self.url_argument = "url"
        #: When (``time.monotonic()``) the key layout versions under the prefix were last
        #: found to be this process's (core/layout.py), None not yet: the runners check them
        #: before a connection's first script call, and again once :data:`.layout.RECHECK_S`
        #: passed (which keeps the record alive).
        self.layout_checked_at: float | None = None

    #: The scripts the handles build their calls with.
    scripts: Scripts
    #: How many replicas a lock's writes wait for (None: none), see :mod:`.replication`.
    replication: Replication | None

    def backend_error(self, exc: BaseException) -> LockBackendError:
        """The :class:`LockBackendError` for a Redis failure: one that names the server; a
        refused login says where the password goes instead of Redis's protocol words."""
        if is_auth_error(exc):
            return LockBackendError(auth_message(self.url, self.url_argument, exc))
        return LockBackendError(f"Redis at {self.url}: {exc}")

    @staticmethod
    def check_client(redis_client: Any) -> None:
        """ConfigurationError unless ``redis_client`` is the kind of client this takes."""
        raise NotImplementedError

    def needs_layout(self, step: steps.Step) -> steps.CheckLayout | None:
        """The layout check a runner does before ``step``: before a connection's first
        script call (with the versions recorded), or a :class:`steps.CheckLayout` step's, until
        they were found equal on this connection, and again a day after; None: nothing to
        check."""
        checked = self.layout_checked_at
        if checked is not None and time.monotonic() - checked < RECHECK_S:
            return None
        if isinstance(step, steps.CheckLayout):
            return step
        return steps.CheckLayout() if type(step) is tuple or isinstance(step, steps.Batch) else None

    def layout_checked_by(self, reply: Any) -> None:
        """Read the reply of the layout script (:func:`.layout.check_reply`)."""
        complete = check_reply(reply, self.prefix, self.url)
        self.layout_checked_at = time.monotonic() if complete else None

    def keys(self, name: str) -> LockKeys:
        """The Redis keys of lock ``name`` (checked) under this prefix."""
        return lock_keys(self.prefix, validate.check_name(name))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} prefix={self.prefix!r}>"


class Connection(ConnectionBase):
    """A redis-py client, the key ``prefix`` of every lock on it, and what the handles and
    the admin need from it: ``keys(name)``, ``call(fn, ...)``, the ``scripts``, the
    ``notifier``, and :meth:`run`, the sync runner of their steps (core/steps.py).
    ``replication``: how many replicas a lease's writes wait for (None: none), see
    :mod:`.replication`."""

    def __init__(
        self, redis_client: Any, prefix: str, replication: Replication | None = None
    ) -> None:
        super().__init__(redis_client, prefix)
        self.replication = replication
        self.scripts = Scripts(redis_client, replication)
        #: Shared by every Connection on the same pool (one pub/sub connection).
        self.notifier = notifier_for(redis_client)
        self._closed = False

    @staticmethod
    def check_client(redis_client: Any) -> None:
        if not hasattr(redis_client, "register_script"):
            raise ConfigurationError(
                "redis_client", f"must be a redis-py client, got {type(redis_client).__name__}"
            )

    def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one Redis operation; Redis failures become :class:`LockBackendError`."""
        try:
            return function(*args, **kwargs)
        except redis.ResponseError as exc:
            if "DB index is out of range" in str(exc):
                # Retrying cannot help: the URL names a database this server does not have.
                raise ConfigurationError(
                    self.url_argument,
                    f"bad configuration: {self.url}: the server has no such database "
                    "(its 'databases' setting is lower); use a database number it has",
                ) from exc
            raise self.backend_error(exc) from exc
        except (redis.RedisError, RedisClusterException) as exc:
            raise self.backend_error(exc) from exc

    def run(self, operation: steps.Steps[T]) -> T:
        """Run an operation's steps (see :mod:`.steps`) on this thread; its result. An
        error doing a step is thrown into the operation, which handles it or lets it go."""
        listening: AbstractContextManager[Wakeup] | None = None
        woken: Wakeup | None = None
        try:
            step = operation.send(None)
            while True:
                try:
                    if isinstance(step, steps.Pause):
                        if woken is not None:
                            woken.wait(step.seconds)
                        else:
                            time.sleep(step.seconds)
                        result = None
                    elif isinstance(step, steps.Listen):
                        assert listening is None, step
                        entering = self.notifier.listening(*step.channels)
                        woken = entering.__enter__()
                        listening, result = entering, None
                    else:
                        result = self.do(step)
                except BaseException as exc:
                    step = operation.throw(exc)
                else:
                    step = operation.send(result)
        except StopIteration as done:
            value: T = done.value
            return value
        finally:
            if listening is not None:
                listening.__exit__(None, None, None)

    def do(self, step: steps.Step) -> Any:
        """One step that is a round trip (not a :class:`steps.Listen` or :class:`steps.Pause`); its
        reply. The layout check first where :meth:`needs_layout` says so."""
        check = self.needs_layout(step)
        if check is not None:
            script, keys, args = layout_call(self, record=check.record)
            self.layout_checked_by(self.call(script, keys=keys, args=args))
        if type(step) is tuple:
            script, keys, args = step
            return self.call(script, keys=keys, args=args)
        if isinstance(step, steps.Batch):
            return self.call(run_batch, self.redis, step.calls, self.replication)
        if isinstance(step, steps.Command):
            return self.call(step.of, self.redis)
        if isinstance(step, steps.Pipeline):
            return self.call(step.run, self.redis)
        if isinstance(step, steps.Scan):
            return self.call(step.keys, self.redis)
        if isinstance(step, steps.Blpop):
            return self.call(self.redis.blpop, [step.key], timeout=step.timeout)
        assert isinstance(step, steps.CheckLayout), step
        return None

    def check_layout(self, *, record: bool = True) -> None:
        """Record this process's key layout versions under the prefix where none are (not
        without ``record``), and raise :class:`KeyLayoutError` if those recorded differ
        (core/layout.py); nothing once they were found equal on this connection."""
        self.do(steps.CheckLayout(record=record))

    def server_time(self) -> float:
        """The Redis server's clock, in seconds since the epoch."""
        return self.run(steps.server_seconds())

    def server_ms(self) -> int:
        """The Redis server's clock in ms (the clock every lock time is written with)."""
        return self.run(steps.server_ms())

    def close(self) -> None:
        """Close the client (its pool too if the client owns it: it was made from a URL),
        and the waiter listener with its pub/sub connection if no other open client on
        the pool shares it."""
        if not self._closed:
            self._closed = True
            self.notifier.leave()
        self.redis.close()


class HasConnection(Protocol):
    """What owns a :class:`Connection` (a ``LockClient``)."""

    @property
    def connection(self) -> Connection: ...


def connection_of(source: Connection | HasConnection) -> Connection:
    """The Connection of ``source``: itself, or its ``connection`` (a ``LockClient``)."""
    if isinstance(source, Connection):
        return source
    return source.connection
