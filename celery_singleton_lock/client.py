"""LockClient: the connection to Redis, its server time, and the factory for locks."""

from __future__ import annotations

from . import admin
from .core import redis_urls
from .core.client_base import DEFAULT_SOCKET_TIMEOUT, ClientBase, mask_password
from .core.connection import Connection
from .core.handle import HolderRecord
from .core.options import LeaseOptions, ProcessOptions, options_after
from .kinds.lease import Lease, ReleaseResult, holder_released, release_owner
from .kinds.lease_listing import lease_holders_read
from .kinds.multi import MultiLease
from .kinds.rangelock import RangeLock
from .kinds.rwlock import RWLock
from .kinds.semaphore import Semaphore

__all__ = ["DEFAULT_SOCKET_TIMEOUT", "LockClient", "mask_password"]


class LockClient(ClientBase[Connection, RWLock, RangeLock, Semaphore, MultiLease]):
    """Entry point of the lock core: wraps a redis-py client and makes locks.

    ``prefix`` namespaces every key, so several apps can share one Redis.

    ``replicas`` N > 0: a lock's acquire, renewal, release, hand-over and change (every
    kind) report success only once N replicas acknowledged the write (``WAIT N``, in the
    same round trip), the master waiting at most ``replica_timeout`` seconds for them; see
    docs/deployment.md, "Replicated locks". An acquire not acknowledged in time is undone
    and raises :class:`LockNotReplicated` (a :class:`LockBackendError`).

    >>> client = LockClient.from_url("redis://localhost:6379/0")
    >>> with client.lease("nightly-report", ttl=30, wait=5) as lease:
    ...     write_report(fencing_token=lease.token)
    """

    _connection_type = Connection
    _connect = staticmethod(redis_urls.connect)
    _rwlock_type = RWLock
    _range_lock_type = RangeLock
    _semaphore_type = Semaphore
    _multi_type = MultiLease

    @options_after(LeaseOptions[Lease])
    def lease(self, name: str, options: LeaseOptions[Lease]) -> Lease:
        """An exclusive lease on ``name`` (not yet acquired). See :class:`Lease`; ``fair``:
        blocked acquires are handed the lease by releases, oldest first. ``owner``: hold it
        under this owner token instead of a fresh random one per acquisition (a claim for a
        queued message); ``take_over``: an acquire also succeeds when the name is held under
        this owner token, taking that hold over (a claim made for this run, see
        :meth:`Lease.hand_over`)."""
        return Lease.made(self.connection, name, options)

    @options_after(ProcessOptions)
    def release_holder(self, name: str, process: ProcessOptions) -> bool:
        """Release lease ``name`` (after a release delay of ``delay`` seconds) if task
        ``task_id`` running in process ``pid`` on ``host`` (default: this machine) holds it;
        for a supervisor (the Celery worker's main process) whose child can no longer
        release. A claim handed over for the task's next attempt is never released here.
        True if released."""
        return self.connection.run(holder_released(self.connection, name, process))

    def release_owner(self, name: str, owner: str, *, delay: float = 0.0) -> ReleaseResult:
        """Release lease ``name`` (after a release delay of ``delay`` seconds) if the owner token
        ``owner`` holds it: a claim (see :meth:`Lease.hand_over`) no handle holds. Says what it
        did: released, nothing held, or held by another owner (left alone)."""
        return release_owner(self.connection, name, owner, delay=delay)

    def holders(self, name: str) -> list[HolderRecord]:
        """Who holds lease ``name`` now (a holder, or a release delay), as
        :meth:`Lease.holders`; empty when it is free."""
        return self.connection.run(lease_holders_read([self.connection.keys(name).lock]))

    def locks(self, pattern: str | None = None) -> admin.Listing:
        """Every lock under this client's prefix whose name matches the glob ``pattern``,
        with its holder and whether it is live, stale or in a release delay (see docs/admin.md).
        A list; its ``skipped`` counts the keys matching a lock key pattern that hold another
        type, passed by (and logged)."""
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
