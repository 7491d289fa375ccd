"""LockClient: the connection to Redis, its server time, and the factory for locks."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.exceptions import RedisClusterException

from . import admin
from .admin import LockInfo
from .core import redis_urls
from .core.connection import Connection
from .core.handle import HolderRecord
from .core.keys import DEFAULT_PREFIX
from .core.replication import check_replication
from .exceptions import ConfigurationError, LockBackendError
from .kinds.lease import Lease, ReleaseResult, release_holder, release_owner
from .kinds.lease_listing import read_lease_holders
from .kinds.multi import MultiLease
from .kinds.rangelock import RangeLock
from .kinds.rwlock import RWLock
from .kinds.semaphore import Semaphore

#: Seconds a Redis call made through ``LockClient.from_url`` may take (connect or reply).
DEFAULT_SOCKET_TIMEOUT = 5.0


class LockClient:
    """Entry point of the lock core: wraps a redis-py client and makes locks.

    ``prefix`` namespaces every key, so several apps can share one Redis.

    ``replicas`` N > 0: a lease's acquire, renewal, release and hand-over report success
    only once N replicas acknowledged the write (``WAIT N``, in the same round trip), the
    master waiting at most ``replica_timeout`` seconds for them; see docs/deployment.md,
    "Replicated locks". An acquire not acknowledged in time is undone and raises
    :class:`LockNotReplicated` (a :class:`LockBackendError`).

    >>> client = LockClient.from_url("redis://localhost:6379/0")
    >>> with client.lease("nightly-report", ttl=30, wait=5) as lease:
    ...     write_report(fencing_token=lease.token)
    """

    def __init__(
        self,
        redis_client: Any,
        *,
        prefix: str = DEFAULT_PREFIX,
        replicas: int = 0,
        replica_timeout: float = 1.0,
    ) -> None:
        replication = check_replication(replicas, replica_timeout)
        #: What the handles and the admin functions work through.
        self.connection = Connection(redis_client, prefix, replication)
        self.redis = redis_client
        self.prefix = prefix
        self.url = self.connection.url

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        replicas: int = 0,
        replica_timeout: float = 1.0,
        **redis_kwargs: Any,
    ) -> LockClient:
        """A client for the Redis at ``url``: ``redis://``, ``rediss://``, ``unix://``, a
        Cluster (``redis+cluster://host:port,...``) or Sentinel
        (``sentinel://host:port,.../master-name``), see docs/deployment.md; ``replicas`` and
        ``replica_timeout`` as for :class:`LockClient`; extra keyword arguments go to the
        redis-py client."""
        check_replication(replicas, replica_timeout)
        url = check_url(url, redis_kwargs)
        try:
            client = redis_urls.connect(url, **redis_kwargs)
        except ValueError as exc:
            raise bad_url(url, exc) from None
        except (redis.RedisError, RedisClusterException) as exc:
            # A Cluster client reads the slot map when it is made.
            raise LockBackendError(f"Redis at {mask_password(url)}: {exc}") from exc
        return cls(client, prefix=prefix, replicas=replicas, replica_timeout=replica_timeout)

    def lease(
        self,
        name: str,
        *,
        ttl: float = 30.0,
        heartbeat: bool = True,
        max_hold: float | None = None,
        wait: float = 0.0,
        owner_info: dict[str, Any] | None = None,
        on_lost: Callable[[Lease], object] | None = None,
        fair: bool = False,
        owner: str | None = None,
        take_over: str | None = None,
    ) -> Lease:
        """An exclusive lease on ``name`` (not yet acquired). See :class:`Lease`; ``fair``:
        blocked acquires are handed the lease by releases, oldest first. ``owner``: hold it
        under this owner token instead of a fresh random one per acquisition (a claim for a
        queued message); ``take_over``: an acquire also succeeds when the name is held under
        this owner token, taking that hold over (a claim made for this run, see
        :meth:`Lease.hand_over`)."""
        return Lease(
            self,
            name,
            ttl=ttl,
            heartbeat=heartbeat,
            max_hold=max_hold,
            wait=wait,
            owner_info=owner_info,
            on_lost=on_lost,
            fair=fair,
            owner=owner,
            take_over=take_over,
        )

    def rwlock(self, name: str) -> RWLock:
        """A reader-writer lock on ``name``: ``.read()``, ``.upgradable()`` and ``.write()``
        make handles with the options of :meth:`lease`. See :class:`RWLock`."""
        return RWLock(self, name)

    def range_lock(self, name: str) -> RangeLock:
        """A range lock on ``name``: ``.read(lo, hi)``, ``.upgradable(lo, hi)`` and
        ``.write(lo, hi)`` make handles on closed intervals. See :class:`RangeLock`."""
        return RangeLock(self, name)

    def semaphore(self, name: str, limit: int) -> Semaphore:
        """A counting semaphore on ``name``: at most ``limit`` (an int >= 1) permits held at
        once; ``.permit()`` makes one with the options of :meth:`lease`. See
        :class:`Semaphore`."""
        return Semaphore(self, name, limit)

    def multi(
        self,
        names: Iterable[str],
        *,
        ttl: float = 30.0,
        heartbeat: bool = True,
        max_hold: float | None = None,
        wait: float = 0.0,
        owner_info: dict[str, Any] | None = None,
        on_lost: Callable[[MultiLease], object] | None = None,
    ) -> MultiLease:
        """Exclusive leases on all of ``names``, taken all or nothing (not yet acquired);
        each conflicts with a plain :meth:`lease` on that name. See :class:`MultiLease`."""
        return MultiLease(
            self,
            names,
            ttl=ttl,
            heartbeat=heartbeat,
            max_hold=max_hold,
            wait=wait,
            owner_info=owner_info,
            on_lost=on_lost,
        )

    def release_holder(
        self,
        name: str,
        *,
        task_id: str,
        pid: int,
        host: str | None = None,
        delay: float = 0.0,
    ) -> bool:
        """Release lease ``name`` (after a release delay of ``delay`` seconds) if task
        ``task_id`` running in process ``pid`` on ``host`` (default: this machine) holds it;
        for a supervisor (the Celery worker's main process) whose child can no longer
        release. A claim handed over for the task's next attempt is never released here.
        True if released."""
        return release_holder(
            self.connection, name, task_id=task_id, pid=pid, host=host, delay=delay
        )

    def release_owner(self, name: str, owner: str, *, delay: float = 0.0) -> ReleaseResult:
        """Release lease ``name`` (after a release delay of ``delay`` seconds) if the owner token
        ``owner`` holds it: a claim (see :meth:`Lease.hand_over`) no handle holds. Says what it
        did: released, nothing held, or held by another owner (left alone)."""
        return release_owner(self.connection, name, owner, delay=delay)

    def holders(self, name: str) -> list[HolderRecord]:
        """Who holds lease ``name`` now (a holder, or a release delay), as
        :meth:`Lease.holders`; empty when it is free."""
        return read_lease_holders(self.connection, [self.connection.keys(name).lock])

    def locks(self, pattern: str | None = None) -> list[LockInfo]:
        """Every lock under this client's prefix whose name matches the glob ``pattern``,
        with its holder and whether it is live, stale or in a release delay (see docs/admin.md)."""
        return admin.list_locks(self.connection, pattern)

    def clear(self, name: str, *, token: int | None = None, force: bool = False) -> bool:
        """Clear lock ``name`` (only its holder with fencing ``token``, if given): atomic and
        holder-checked, so a lock re-acquired meanwhile is left alone. A live lock is cleared
        only with ``force``, else :class:`LockError`. True if something was cleared.
        ``token`` is an int >= 1 and ``force`` a bool, else :class:`ConfigurationError`."""
        return admin.clear(self.connection, name, token=token, force=force)

    def server_time(self) -> float:
        """The Redis server's clock, in seconds since the epoch."""
        return self.connection.server_time()

    def server_ms(self) -> int:
        """The Redis server's clock in ms (the clock every lock time is written with)."""
        return self.connection.server_ms()

    def ping(self) -> bool:
        """True if Redis answers; raises :class:`LockBackendError` if not."""
        return bool(self.connection.call(self.redis.ping))

    def close(self) -> None:
        """Stop this client's waiter listener and close its connections."""
        self.connection.close()

    def __repr__(self) -> str:
        return f"<LockClient {self.url} prefix={self.prefix!r}>"


def check_url(url: object, redis_kwargs: dict[str, Any]) -> str:
    """The ``url`` of a ``from_url`` (a non-empty str, else ConfigurationError), and its
    ``redis_kwargs`` given the default socket timeouts."""
    if not isinstance(url, str) or not url:
        raise ConfigurationError("url", f"must be a non-empty str, got {url!r}")
    # A Redis that stops answering (paused, partitioned) must not block the heartbeat
    # (thread or task), which renews every lease of the process or loop, for ever: redis-py
    # before 8 has no socket timeout by default. A timeout in the URL's query string wins.
    redis_kwargs.setdefault("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
    redis_kwargs.setdefault("socket_connect_timeout", DEFAULT_SOCKET_TIMEOUT)
    return url


def bad_url(url: str, error: ValueError) -> ConfigurationError:
    """The error for a ``url`` redis-py refused with ``error`` (its password masked)."""
    return ConfigurationError("url", f"{mask_password(url)}: {error}")


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


def safe_url(redis_client: Any) -> str:
    """A URL naming the server(s) of ``redis_client``, with no password in it."""
    return redis_urls.safe_url(redis_client)
