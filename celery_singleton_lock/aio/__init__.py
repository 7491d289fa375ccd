"""The lock core on ``redis.asyncio`` (see docs/asyncio.md): :class:`AsyncLockClient` and its
handles, with the keys, scripts and guarantees of the sync core."""

from .client import AsyncLockClient
from .handle import AsyncLockHandle
from .lease import AsyncLease
from .multi import AsyncMultiLease
from .rwlock import AsyncRangeLock, AsyncRangeLockHandle, AsyncRWLock, AsyncRWLockHandle
from .semaphore import AsyncPermit, AsyncSemaphore

__all__ = [
    "AsyncLockClient",
    "AsyncLockHandle",
    "AsyncLease",
    "AsyncRWLock",
    "AsyncRWLockHandle",
    "AsyncRangeLock",
    "AsyncRangeLockHandle",
    "AsyncMultiLease",
    "AsyncSemaphore",
    "AsyncPermit",
]
