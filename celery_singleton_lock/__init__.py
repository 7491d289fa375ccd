"""Crash-safe Redis locks for Celery tasks.

The lock core (LockClient, Lease; AsyncLockClient on redis.asyncio) works without Celery;
nothing here does I/O at import.
"""

from typing import TYPE_CHECKING

from .admin import LockInfo
from .client import LockClient
from .core.handle import HolderRecord
from .exceptions import (
    ConfigurationError,
    DuplicateTask,
    KeyLayoutError,
    LockBackendError,
    LockError,
    LockExpired,
    LockLost,
    LockNotHeld,
    LockNotReplicated,
    LockTaken,
    LockTimeout,
)
from .kinds.lease import Lease, ReleaseResult
from .kinds.multi import MultiLease
from .kinds.rangelock import RangeLock, RangeLockHandle
from .kinds.rwlock import RWLock, RWLockHandle
from .kinds.semaphore import Permit, Semaphore

if TYPE_CHECKING:
    from .aio import AsyncLockClient

__all__ = [
    # the lock core
    "LockClient",
    "Lease",
    # what release_owner and holders() return (docs/lease.md, "Claims")
    "ReleaseResult",
    "HolderRecord",
    # the same on redis.asyncio (docs/asyncio.md)
    "AsyncLockClient",
    # reader-writer, range and multi-key locks
    "RWLock",
    "RWLockHandle",
    "RangeLock",
    "RangeLockHandle",
    "MultiLease",
    # counting semaphores
    "Semaphore",
    "Permit",
    # the admin side (docs/admin.md)
    "LockInfo",
    # errors
    "LockError",
    "ConfigurationError",
    "LockBackendError",
    "LockNotReplicated",
    "LockTimeout",
    "LockLost",
    "LockExpired",
    "LockTaken",
    "LockNotHeld",
    "DuplicateTask",
    "KeyLayoutError",
    # the Celery layer (imported lazily: the lock core never imports celery)
    "SingletonTask",
    "is_skipped",
    "install",
    "lock_acquired",
    "lock_skipped",
    "lock_lost",
    "lock_released",
]

#: Imported lazily: the lock core never imports celery, and Celery imports this package (the
#: CLI plugin) in every worker, which has no use for the asyncio client.
_LAZY = {
    "AsyncLockClient": "aio",
    "SingletonTask": "celery.task",
    "is_skipped": "celery.results",
    "install": "celery.worker",
    "lock_acquired": "celery.signals",
    "lock_skipped": "celery.signals",
    "lock_lost": "celery.signals",
    "lock_released": "celery.signals",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'celery_singleton_lock' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), name)


__version__ = "0.1.0"
