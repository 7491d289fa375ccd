"""The locks compared, behind one small interface.

Every adapter is built on the same plain ``redis.Redis`` client, so all pay the same
connection costs, and each makes a new lock object for every acquire, as each library's docs
show it used (``with client.lock(name): ...``, ``with lock_client.lease(name): ...``): the
cost of building one is part of every use.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pottery
import redis
import redis.asyncio
import redis_lock

from celery_singleton_lock import LockClient
from celery_singleton_lock.aio import AsyncLockClient
from celery_singleton_lock.core.replies import Reply, acquire_outcome
from celery_singleton_lock.core.scripts import run

#: The floor's release: compare-and-delete, the least a safe release can do.
FLOOR_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

#: How long the floor's blocking acquire sleeps between attempts.
FLOOR_POLL = 0.001


class Handle(Protocol):
    """One lock on one name."""

    def try_acquire(self) -> bool: ...

    def acquire_blocking(self, timeout: float) -> bool: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


def release_timed(handle: Handle) -> float:
    """Release ``handle``; ``time.monotonic()`` just before the release: the handle's own
    stamp if it takes one inside its call (``released_at``: asyncio), else taken here."""
    released_at = time.monotonic()
    handle.release()
    return float(getattr(handle, "released_at", released_at))


def acquire_timed(handle: Handle, timeout: float) -> float | None:
    """``time.monotonic()`` just after a blocking acquire of ``handle`` returned (the
    handle's own stamp if it takes one, ``acquired_at``); None if it timed out."""
    if not handle.acquire_blocking(timeout):
        return None
    return float(getattr(handle, "acquired_at", time.monotonic()))


#: (redis client, key prefix, lock name, ttl seconds) -> handle
Factory = Callable[[redis.Redis, str, str, float], Handle]


@dataclass(frozen=True)
class Anchor:
    key: str
    label: str
    #: How a blocked acquire learns that the lock is free (shown in the hand-off table).
    waits_by: str
    make: Factory
    #: Only in the hand-off table (an asyncio lock run from sync code: its throughput here
    #: would be the harness's loop starts, not the lock's).
    handoff_only: bool = False


class FloorLock:
    """``SET key token NX PX ttl``; release by a registered compare-and-delete script."""

    def __init__(self, client: redis.Redis, prefix: str, name: str, ttl: float) -> None:
        self._client = client
        self._key = prefix + name
        self._ttl_ms = int(ttl * 1000)
        self._release = client.register_script(FLOOR_RELEASE)
        self._token = ""

    def try_acquire(self) -> bool:
        token = uuid.uuid4().hex
        if self._client.set(self._key, token, nx=True, px=self._ttl_ms):
            self._token = token
            return True
        return False

    def acquire_blocking(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                return False
            time.sleep(FLOOR_POLL)  # the floor's wait: a tight polling loop
        return True

    def release(self) -> None:
        if not self._release(keys=[self._key], args=[self._token]):
            raise RuntimeError(f"floor lock {self._key!r} was not held")

    def close(self) -> None:
        """Nothing of its own to close (the client is the caller's)."""


class _LibraryLock:
    """A competitor's lock object, a new one per acquire, with ``acquire(blocking=...)`` and
    ``release()``; the subclasses make the object and name their blocking-timeout keyword."""

    _timeout_keyword = "timeout"
    _lock: Any

    def _new_lock(self) -> Any:
        raise NotImplementedError

    def try_acquire(self) -> bool:
        self._lock = self._new_lock()
        return bool(self._lock.acquire(blocking=False))

    def acquire_blocking(self, timeout: float) -> bool:
        self._lock = self._new_lock()
        return bool(self._lock.acquire(blocking=True, **{self._timeout_keyword: timeout}))

    def release(self) -> None:
        self._lock.release()

    def close(self) -> None:
        """Nothing of its own to close (the client is the caller's)."""


class RedisPyLock(_LibraryLock):
    """``redis.lock.Lock`` via ``client.lock``; blocking acquire polls every 0.1 s (default)."""

    _timeout_keyword = "blocking_timeout"

    def __init__(self, client: redis.Redis, prefix: str, name: str, ttl: float) -> None:
        self._client, self._key, self._ttl = client, prefix + name, ttl

    def _new_lock(self) -> Any:
        return self._client.lock(self._key, timeout=self._ttl)


class PythonRedisLock(_LibraryLock):
    """python-redis-lock: SET NX; a blocked acquire waits in BLPOP on a signal list."""

    def __init__(self, client: redis.Redis, prefix: str, name: str, ttl: float) -> None:
        self._client, self._key, self._expire = client, prefix + name, max(1, int(ttl))

    def _new_lock(self) -> Any:
        return redis_lock.Lock(self._client, self._key, expire=self._expire)


class PotteryLock(_LibraryLock):
    """pottery ``Redlock`` with one master; a blocked acquire retries after 0-0.2 s."""

    def __init__(self, client: redis.Redis, prefix: str, name: str, ttl: float) -> None:
        self._client, self._key, self._ttl = client, prefix + name, ttl

    def _new_lock(self) -> Any:
        return pottery.Redlock(key=self._key, masters={self._client}, auto_release_time=self._ttl)


class OurLease:
    """``lock_client.lease(name, ttl=..., heartbeat=True)``, a new one per acquire; a
    blocked acquire is woken by the holder's release over pub/sub."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        name: str,
        ttl: float,
        *,
        heartbeat: bool = True,
        fair: bool = False,
    ) -> None:
        self._client = LockClient(client, prefix=prefix)
        self._name, self._ttl, self._heartbeat, self._fair = name, ttl, heartbeat, fair
        self._lease: Any = None

    def _new_lease(self) -> Any:
        return self._client.lease(
            self._name, ttl=self._ttl, heartbeat=self._heartbeat, fair=self._fair
        )

    def try_acquire(self) -> bool:
        self._lease = self._new_lease()
        return bool(self._lease.acquire(wait=0))

    def acquire_blocking(self, timeout: float) -> bool:
        self._lease = self._new_lease()
        return bool(self._lease.acquire(wait=timeout))

    def release(self) -> None:
        self._lease.release()

    def close(self) -> None:
        """Nothing of its own to close (the client is the caller's)."""


class OurScripts:
    """Ours without the Lease object: its acquire and release scripts called directly with
    the same arguments. Not a public API: it shows what the Lua scripts alone cost."""

    def __init__(self, client: redis.Redis, prefix: str, name: str, ttl: float) -> None:
        ours = LockClient(client, prefix=prefix)
        self._lease = ours.lease(name, ttl=ttl, heartbeat=False)
        self._scripts = ours.connection.scripts
        self._owner = ""

    def try_acquire(self) -> bool:
        lease = self._lease
        self._owner = os.urandom(16).hex()
        reply = run(self._scripts.acquire_call(
            lease.keys.lock, lease.keys.fence, self._owner, lease._ttl_ms, 0,
            lease._packed_holder(),
        ))  # fmt: skip
        return acquire_outcome(reply)[0] == Reply.DONE

    def acquire_blocking(self, timeout: float) -> bool:
        raise NotImplementedError("throughput only")

    def release(self) -> None:
        lease = self._lease
        if run(self._scripts.release_call(lease.keys.lock, self._owner, 0)) != Reply.DONE:
            raise RuntimeError("not held")

    def close(self) -> None:
        """Nothing of its own to close (the client is the caller's)."""


class OurAsyncLease:
    """``AsyncLockClient(...).lease(name, ttl=..., heartbeat=True)``, a new one per acquire,
    on an event loop of the handle's own, which runs only during a call
    (``run_until_complete``). Starting and stopping that loop around each call is this
    harness's cost, not an async application's, whose loop runs all along: so the hand-off
    is timed inside the coroutines, just before the release is awaited (``released_at``) and
    just after the acquire returned (``acquired_at``), as the sync locks are timed around
    their calls."""

    def __init__(
        self, client: redis.Redis, prefix: str, name: str, ttl: float, *, fair: bool = False
    ) -> None:
        self._loop = asyncio.new_event_loop()
        kwargs = client.connection_pool.connection_kwargs
        self._client = AsyncLockClient(
            redis.asyncio.Redis(host=kwargs["host"], port=kwargs["port"], db=kwargs["db"]),
            prefix=prefix,
        )
        self._name, self._ttl, self._fair = name, ttl, fair
        self._lease: Any = None
        self.released_at = 0.0
        self.acquired_at = 0.0

    def try_acquire(self) -> bool:
        return self.acquire_blocking(0)

    def acquire_blocking(self, timeout: float) -> bool:
        async def acquire() -> bool:
            self._lease = self._client.lease(
                self._name, ttl=self._ttl, heartbeat=True, fair=self._fair
            )
            taken = await self._lease.acquire(wait=timeout)
            self.acquired_at = time.monotonic()
            return taken

        return self._loop.run_until_complete(acquire())

    def release(self) -> None:
        async def release() -> None:
            self.released_at = time.monotonic()
            await self._lease.release()

        self._loop.run_until_complete(release())

    def close(self) -> None:
        loop = self._loop
        loop.run_until_complete(self._client.close())
        # What asyncio.run does at the end: the loop's heartbeat task is still waiting.
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.close()


def our_async_fair_lease(client: redis.Redis, prefix: str, name: str, ttl: float) -> OurAsyncLease:
    return OurAsyncLease(client, prefix, name, ttl, fair=True)


def our_fair_lease(client: redis.Redis, prefix: str, name: str, ttl: float) -> OurLease:
    return OurLease(client, prefix, name, ttl, fair=True)


def our_lease_without_heartbeat(
    client: redis.Redis, prefix: str, name: str, ttl: float
) -> OurLease:
    return OurLease(client, prefix, name, ttl, heartbeat=False)


ANCHORS: dict[str, Anchor] = {
    anchor.key: anchor
    for anchor in (
        Anchor(
            "floor", "floor: SET NX PX + Lua compare-and-delete", "SET NX every 1 ms", FloorLock
        ),
        Anchor("redis-py", "redis-py redis.lock.Lock", "polls every 0.1 s (default)", RedisPyLock),
        Anchor(
            "python-redis-lock",
            "python-redis-lock redis_lock.Lock",
            "BLPOP on a signal list",
            PythonRedisLock,
        ),
        Anchor("pottery", "pottery Redlock, 1 master", "retries after random 0-0.2 s", PotteryLock),
        Anchor(
            "ours", "ours: LockClient.lease(heartbeat=True)", "pub/sub wake-up on release", OurLease
        ),
        Anchor(
            "ours-fair",
            "ours: LockClient.lease(fair=True)",
            "handed the lease by the release (BLPOP)",
            our_fair_lease,
        ),
        Anchor(
            "ours-async",
            "ours: AsyncLockClient.lease (asyncio)",
            "pub/sub wake-up on release (the loop's listener task)",
            OurAsyncLease,
            handoff_only=True,
        ),
        Anchor(
            "ours-async-fair",
            "ours: AsyncLockClient.lease(fair=True) (asyncio)",
            "handed the lease by the release (BLPOP)",
            our_async_fair_lease,
            handoff_only=True,
        ),
    )
}


#: Extra rows of the throughput table, to tell where ours spends its time (not competitors).
DIAGNOSTICS: dict[str, Anchor] = {
    anchor.key: anchor
    for anchor in (
        Anchor("ours-no-heartbeat", "  (ours, heartbeat=False)", "", our_lease_without_heartbeat),
        Anchor("ours-scripts", "  (ours' Lua scripts alone, no Lease)", "", OurScripts),
    )
}
