"""What :class:`LockClient` and :class:`AsyncLockClient` share: making their connection (from
a redis-py client or a URL), the views of it (``redis``, ``prefix``, ``url``, the repr), and
the lock factories whose options are the same on both."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.exceptions import RedisClusterException

from ..exceptions import ConfigurationError, LockBackendError
from . import validate
from .connection import ConnectionBase
from .handle_ops import HandleOps
from .keys import DEFAULT_PREFIX
from .options import LockOptions, options_after
from .replication import Replication, check_replication

#: Seconds a Redis call made through ``from_url`` may take (connect or reply).
DEFAULT_SOCKET_TIMEOUT = 5.0


ConnT = TypeVar("ConnT", bound=ConnectionBase)
RWLockT = TypeVar("RWLockT")
RangeLockT = TypeVar("RangeLockT")
SemaphoreT = TypeVar("SemaphoreT")
MultiT = TypeVar("MultiT", bound=HandleOps)
ClientT = TypeVar("ClientT", bound="ClientBase[Any, Any, Any, Any, Any]")


class ClientBase(Generic[ConnT, RWLockT, RangeLockT, SemaphoreT, MultiT]):
    """A front end over one connection (sync or asyncio), and the lock factories whose
    options are the same on both: the subclass names its connection and handle classes, and
    how a URL becomes its redis-py client."""

    #: What the handles and the admin functions work through.
    connection: ConnT
    _connection_type: Callable[[Any, str, Replication | None], ConnT]
    #: ``redis_urls.connect`` or ``redis_urls.connect_async``.
    _connect: Callable[..., Any]
    _rwlock_type: Callable[[ConnT, str], RWLockT]
    _range_lock_type: Callable[[ConnT, str], RangeLockT]
    _semaphore_type: Callable[[ConnT, str, int], SemaphoreT]
    _multi_type: type[MultiT]

    def __init__(
        self,
        redis_client: Any,
        *,
        prefix: str = DEFAULT_PREFIX,
        replicas: int = 0,
        replica_timeout: float = 1.0,
    ) -> None:
        replication = check_replication(replicas, replica_timeout)
        self.connection = self._connection_type(redis_client, prefix, replication)

    @classmethod
    def from_url(
        cls: type[ClientT],
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        replicas: int = 0,
        replica_timeout: float = 1.0,
        **redis_kwargs: Any,
    ) -> ClientT:
        """A client for the Redis at ``url``: ``redis://``, ``rediss://``, ``unix://``, a
        Cluster (``redis+cluster://host:port,...``) or Sentinel
        (``sentinel://host:port,.../master-name``), see docs/deployment.md; ``replicas`` and
        ``replica_timeout`` as for the client's class; extra keyword arguments go to the
        redis-py client (``redis.asyncio``'s for an :class:`AsyncLockClient`, which does no
        I/O until its first lock call)."""
        check_replication(replicas, replica_timeout)
        client = connect_url(url, prefix, redis_kwargs, cls._connect)
        return cls(client, prefix=prefix, replicas=replicas, replica_timeout=replica_timeout)

    @property
    def redis(self) -> Any:
        """The redis-py client."""
        return self.connection.redis

    @property
    def prefix(self) -> str:
        """The key prefix of every lock of this client."""
        return self.connection.prefix

    @property
    def url(self) -> str:
        """The server(s), with no password."""
        return self.connection.url

    def rwlock(self, name: str) -> RWLockT:
        """A reader-writer lock on ``name``: ``.read()``, ``.upgradable()`` and ``.write()``
        make handles with the options of :meth:`lease`, and ``call`` (a call identity: no
        two holds of one call at once). See :class:`RWLock`."""
        return self._rwlock_type(self.connection, name)

    def range_lock(self, name: str) -> RangeLockT:
        """A range lock on ``name``: ``.read(lo, hi)``, ``.upgradable(lo, hi)`` and
        ``.write(lo, hi)`` make handles on closed intervals (options: those of :meth:`lease`,
        and ``call``, a call identity). See :class:`RangeLock`."""
        return self._range_lock_type(self.connection, name)

    def semaphore(self, name: str, limit: int) -> SemaphoreT:
        """A counting semaphore on ``name``: at most ``limit`` (an int >= 1) permits held at
        once, shared by the sync and the asyncio clients; ``.permit()`` makes one with the
        options of :meth:`lease`, and ``call`` (a call identity: no call holds two permits).
        See :class:`Semaphore`."""
        return self._semaphore_type(self.connection, name, limit)

    @options_after(LockOptions[Any])
    def multi(self, names: Iterable[str], options: LockOptions[Any]) -> MultiT:
        """Exclusive leases on all of ``names``, taken all or nothing (not yet acquired);
        each conflicts with a plain :meth:`lease` on that name. Options as for
        :meth:`lease` (but ``fair``). See :class:`MultiLease`."""
        return self._multi_type.made(self.connection, names, options)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} prefix={self.prefix!r}>"


def connect_url(
    url: object, prefix: str, redis_kwargs: dict[str, Any], connect: Callable[..., Any]
) -> Any:
    """The redis-py client ``connect(url, **redis_kwargs)`` makes, ``url`` and ``prefix``
    checked first (ConfigurationError naming the argument, before any Redis call: a Cluster
    client reads the slot map when it is made)."""
    if not isinstance(url, str) or not url:
        raise ConfigurationError("url", f"must be a non-empty str, got {url!r}")
    validate.check_prefix(prefix)
    # A Redis that stops answering (paused, partitioned) must not block the heartbeat
    # (thread or task), which renews every lease of the process or loop, for ever: redis-py
    # before 8 has no socket timeout by default. A timeout in the URL's query string wins.
    redis_kwargs.setdefault("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
    redis_kwargs.setdefault("socket_connect_timeout", DEFAULT_SOCKET_TIMEOUT)
    try:
        return connect(url, **redis_kwargs)
    except ValueError as exc:
        raise ConfigurationError("url", f"{mask_password(url)}: {exc}") from None
    except (redis.RedisError, RedisClusterException) as exc:
        raise LockBackendError(f"Redis at {mask_password(url)}: {exc}") from exc


def mask_password(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]  # as written: parts.port raises on a bad port
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
