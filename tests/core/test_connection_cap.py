"""Every connection the library opens counts against the user's cap: script calls go through
the client's pool, and the waiters of a client share one pub/sub connection per process, the
only one outside it (docs/deployment.md). Counted on the server with ``CLIENT LIST``, by the
client name the test's pool gives its connections (the pub/sub one copies the pool's
settings, so it carries the name too)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis
from redis.exceptions import MaxConnectionsError

from celery_singleton_lock import LockBackendError, LockClient

T = TypeVar("T")

THREADS = 20
CAP = 4
ROUNDS = 5
#: The one pub/sub connection the waiters of a client share, beside the pool's.
PUBSUB = 1


def named(admin: redis.Redis, name: str) -> int:
    """How many of the server's connections carry the client name ``name``."""
    return sum(1 for entry in admin.client_list() if entry.get("name") == name)


class Peak:
    """The most connections named ``name`` seen at once, sampled until stopped."""

    def __init__(self, url: str, name: str) -> None:
        self._admin = redis.Redis.from_url(url)
        self._name = name
        self._stop = threading.Event()
        self.most = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.most = max(self.most, named(self._admin, self._name))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        self.most = max(self.most, named(self._admin, self._name))
        self._admin.close()
        return self.most


def over_the_cap(exc: LockBackendError) -> bool:
    """The plain pool refused a connection beyond its cap (nothing was sent)."""
    return isinstance(exc.__cause__, MaxConnectionsError)


def until_done(call: Callable[[], T], refused: list[int]) -> T:
    """``call()``; again while a plain pool refuses a connection over its cap, as its user
    would (a ``BlockingConnectionPool`` waits instead)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return call()
        except LockBackendError as exc:
            if not over_the_cap(exc) or time.monotonic() > deadline:
                raise
            refused.append(1)
            time.sleep(0.001)  # a retry's back-off, not a synchronisation


def make_pool(kind: str, url: str, name: str) -> redis.ConnectionPool:
    if kind == "blocking":
        return redis.BlockingConnectionPool.from_url(
            url, max_connections=CAP, timeout=60, client_name=name
        )
    return redis.ConnectionPool.from_url(url, max_connections=CAP, client_name=name)


@pytest.fixture
def admin(lock_redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(lock_redis_url)
    yield client
    client.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["plain", "blocking"])
def test_twenty_threads_open_no_more_connections_than_the_pools_cap(
    lock_redis_url: str, lock_prefix: str, admin: redis.Redis, kind: str
) -> None:
    """20 threads take and release leases of their own, then all wait on a busy one, on a
    pool of 4: the server never sees more than 4 + the one pub/sub connection of theirs
    (a blocking pool makes the threads wait their turn, and never deadlocks)."""
    name = f"cap-{uuid.uuid4().hex[:12]}"
    client = LockClient(
        redis.Redis(connection_pool=make_pool(kind, lock_redis_url, name)), prefix=lock_prefix
    )
    busy = client.lease("busy", ttl=30)
    assert busy.acquire()
    peak = Peak(lock_redis_url, name)
    waiting = threading.Barrier(THREADS + 1)
    finished = threading.Barrier(THREADS + 1)
    leave = threading.Event()
    done: list[int] = []
    refused: list[int] = []
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for _ in range(ROUNDS):
                lease = until_done(lambda: client.lease(f"own-{n}", ttl=30), refused)
                assert until_done(lambda lease=lease: lease.acquire(wait=0), refused)
                until_done(lease.release, refused)
            waiting.wait(60)

            def take_busy() -> Any:
                waiter = client.lease("busy", ttl=30)
                assert waiter.acquire(wait=60)
                return waiter

            waiter = until_done(take_busy, refused)
            until_done(waiter.release, refused)
            done.append(n)
        except BaseException as exc:  # the test looks at what was raised
            errors.append(exc)
            waiting.abort()
        finally:
            finished.wait(120)
            leave.wait(60)  # the threads are alive while their connections are counted

    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    try:
        waiting.wait(60)
        # Every thread is now on its way into a wait on the busy lease: the release lets
        # them through one by one.
        wait_until_subscribed(admin, client.connection.keys("busy").channel)
        until_done(busy.release, refused)
        finished.wait(120)
        at_the_end = named(admin, name)
    except BaseException:
        waiting.abort()  # a failure here must not leave the threads at a barrier
        finished.abort()
        raise
    finally:
        leave.set()
        for thread in threads:
            thread.join(30)
        most = peak.stop()
        client.close()
        client.redis.connection_pool.disconnect()
    assert errors == []
    assert sorted(done) == list(range(THREADS))
    assert at_the_end <= CAP + PUBSUB
    assert most <= CAP + PUBSUB
    if kind == "blocking":
        assert refused == []


def wait_until_subscribed(admin: redis.Redis, channel: bytes) -> None:
    """Until some waiter listens on ``channel`` (the others follow; a release before they
    subscribe only lets them through sooner)."""
    deadline = time.monotonic() + 30
    while dict(admin.pubsub_numsub(channel)).get(channel, 0) < 1:
        if time.monotonic() > deadline:
            pytest.fail("no waiter subscribed to the busy lease's channel")
        time.sleep(0.01)
