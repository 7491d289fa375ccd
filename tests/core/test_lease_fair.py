"""Fair leases: a release hands the lease straight to the oldest live queued waiter.

The interleavings are driven step by step through the scripts: a waiter's queued attempt,
its registration running out, a release, a waiter giving up while being handed the lease.
"""

from __future__ import annotations

import re
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from support.proxies import HoldingProxy
from support.waiting import BackgroundAcquire, wait_for

from celery_singleton_lock import ConfigurationError, Lease, LockClient
from celery_singleton_lock.core.holder import flatten
from celery_singleton_lock.core.replies import Reply, acquire_outcome
from celery_singleton_lock.core.scripts import fair_keys, pack_holder, run
from celery_singleton_lock.kinds.lease import FAIR_REGISTRATION_MS


def waiter_keys(lock_client: LockClient, base: bytes) -> list[bytes]:
    """The fair waiters' own keys under a lock's ``base`` (registrations, hand-off lists)."""
    pattern = re.sub(rb"([*?\[\]\\])", rb"\\\1", base)
    return [k for part in (b"w:*", b"m:*") for k in lock_client.redis.scan_iter(pattern + part)]


@pytest.fixture
def holder(lock_client: LockClient) -> Lease:
    lease = lock_client.lease("fair", ttl=30, heartbeat=False)
    assert lease.acquire()
    return lease


def queue_up(client: LockClient, lease: Lease, owner: str, thread: str) -> tuple[bool, int]:
    """One queued attempt of fair waiter ``owner`` (as its acquire makes while blocked)."""
    fields = [b"name", b"fair", b"kind", b"lease", b"thread", thread]
    taken, value = acquire_outcome(run(client.connection.scripts.acquire_call(
        lease.keys.lock, lease.keys.fence, owner, 20_000, 0, pack_holder(fields),
        waiting=True, fair_ms=FAIR_REGISTRATION_MS,
    )))  # fmt: skip
    return taken == Reply.DONE, value


def release(client: LockClient, lease: Lease, owner: str, delay_ms: int = 0) -> int:
    return int(run(client.connection.scripts.release_call(lease.keys.lock, owner, delay_ms)))


def abandon(client: LockClient, lease: Lease, owner: str) -> int:
    """Fair waiter ``owner`` gives up: its token if it was handed the lease, else 0."""
    return int(run(client.connection.scripts.fair_abandon_call(lease.keys.lock, owner)))


def holder_of(client: LockClient, lease: Lease) -> dict[bytes, bytes]:
    return flatten(client.redis.hgetall(lease.keys.lock))


def handed(client: LockClient, lease: Lease, owner: str) -> list[bytes]:
    return client.redis.lrange(fair_keys(lease.keys.base, owner)[2], 0, -1)


def test_releases_hand_the_lease_to_waiters_in_arrival_order(
    lock_client: LockClient, holder: Lease
) -> None:
    assert holder.owner is not None
    for owner in ("a", "b", "c"):
        assert queue_up(lock_client, holder, owner, f"thread-{owner}") == (
            False,
            pytest.approx(30_000, abs=5_000),
        )
    tokens = [holder.token]
    previous = holder.owner
    for owner in ("a", "b", "c"):
        assert release(lock_client, holder, previous) == 1
        record = holder_of(lock_client, holder)
        assert record[b"owner"] == owner.encode()
        assert record[b"thread"] == f"thread-{owner}".encode()  # its own holder fields
        assert record[b"ttl_ms"] == b"20000" and b"max_hold_ms" not in record
        assert 0 < lock_client.redis.pttl(holder.keys.lock) <= 20_000
        assert handed(lock_client, holder, owner) == [record[b"token"]]
        assert 0 < lock_client.redis.pttl(fair_keys(holder.keys.base, owner)[2]) <= 20_000
        tokens.append(int(record[b"token"]))
        lock_client.redis.delete(fair_keys(holder.keys.base, owner)[2])  # as its BLPOP does
        previous = owner
    assert tokens == sorted(set(tokens))
    assert release(lock_client, holder, "c") == 1
    assert not lock_client.redis.exists(holder.keys.lock, holder.keys.base + b"queue")


def test_registration_expires_unless_refreshed(lock_client: LockClient, holder: Lease) -> None:
    queue_up(lock_client, holder, "a", "t")
    queue, registration, _ = fair_keys(holder.keys.base, "a")
    for key in (queue, registration):
        assert 0 < lock_client.redis.pttl(key) <= FAIR_REGISTRATION_MS
    queue_up(lock_client, holder, "a", "t")  # a refresh does not queue it twice
    assert lock_client.redis.lrange(queue, 0, -1) == [b"a"]


def test_a_dead_waiter_is_skipped(lock_client: LockClient, holder: Lease) -> None:
    queue_up(lock_client, holder, "dead", "t")
    queue_up(lock_client, holder, "alive", "t")
    # "dead" stopped refreshing: its registration ran out (deleted here rather than waited for).
    lock_client.redis.delete(fair_keys(holder.keys.base, "dead")[1])
    assert holder.owner is not None
    assert release(lock_client, holder, holder.owner) == 1
    assert holder_of(lock_client, holder)[b"owner"] == b"alive"
    assert handed(lock_client, holder, "dead") == []


def test_nobody_left_alive_frees_the_name(lock_client: LockClient, holder: Lease) -> None:
    queue_up(lock_client, holder, "dead", "t")
    lock_client.redis.delete(fair_keys(holder.keys.base, "dead")[1])
    assert holder.owner is not None
    assert release(lock_client, holder, holder.owner) == 1
    assert not lock_client.redis.exists(holder.keys.lock)
    assert lock_client.lease("fair").acquire()


def test_waiter_that_gives_up_leaves_the_queue(lock_client: LockClient, holder: Lease) -> None:
    queue_up(lock_client, holder, "a", "t")
    assert abandon(lock_client, holder, "a") == 0
    queue, registration, _ = fair_keys(holder.keys.base, "a")
    assert not lock_client.redis.exists(queue, registration)
    assert holder.owner is not None
    assert release(lock_client, holder, holder.owner) == 1
    assert not lock_client.redis.exists(holder.keys.lock)


def test_waiter_giving_up_while_being_handed_the_lease_keeps_it(
    lock_client: LockClient, holder: Lease
) -> None:
    queue_up(lock_client, holder, "a", "t")
    assert holder.owner is not None
    assert release(lock_client, holder, holder.owner) == 1  # handed over...
    token = abandon(lock_client, holder, "a")  # ...as it gave up
    record = holder_of(lock_client, holder)
    assert record[b"owner"] == b"a" and token == int(record[b"token"])
    assert handed(lock_client, holder, "a") == []


def test_waiter_handed_the_lease_between_two_blocks_gets_it_from_its_next_attempt(
    lock_client: LockClient, holder: Lease
) -> None:
    queue_up(lock_client, holder, "a", "t")
    assert holder.owner is not None
    assert release(lock_client, holder, holder.owner) == 1
    taken, token = queue_up(lock_client, holder, "a", "t")
    assert taken and token == int(holder_of(lock_client, holder)[b"token"])
    assert handed(lock_client, holder, "a") == []
    assert not lock_client.redis.exists(fair_keys(holder.keys.base, "a")[1])


def test_release_with_a_delay_hands_nothing_over(lock_client: LockClient, holder: Lease) -> None:
    queue_up(lock_client, holder, "a", "t")
    assert holder.owner is not None
    assert release(lock_client, holder, holder.owner, delay_ms=5_000) == 1
    record = holder_of(lock_client, holder)
    assert record[b"owner"] == b"" and record[b"state"] == b"release_delay"
    assert handed(lock_client, holder, "a") == []


def test_blocked_fair_acquire_is_handed_the_lease(lock_client: LockClient, holder: Lease) -> None:
    waiter = lock_client.lease("fair", ttl=30, heartbeat=False, fair=True)
    blocked = BackgroundAcquire(waiter, wait=25)
    queue = holder.keys.base + b"queue"
    wait_for(lambda: lock_client.redis.llen(queue) == 1, 10, "the waiter to queue")
    released_at = time.monotonic()
    holder.release()
    assert blocked.done.wait(20)
    assert time.monotonic() - released_at < 10  # handed over, not found at its hint
    assert blocked.results == [True] and not blocked.errors
    assert waiter.held and waiter.token is not None and holder.token is not None
    assert waiter.token > holder.token
    assert holder_of(lock_client, holder)[b"owner"] == waiter.owner.encode()  # type: ignore[union-attr]
    waiter.release()
    assert not lock_client.redis.exists(holder.keys.lock, queue)


def test_fair_acquire_that_times_out_leaves_no_trace(
    lock_client: LockClient, holder: Lease
) -> None:
    waiter = lock_client.lease("fair", ttl=30, heartbeat=False, fair=True)
    assert not waiter.acquire(wait=0.3)
    assert lock_client.redis.llen(holder.keys.base + b"queue") == 0
    assert not waiter_keys(lock_client, holder.keys.base)
    holder.release()
    assert not lock_client.redis.exists(holder.keys.lock)


def test_fair_must_be_a_bool(lock_client: LockClient) -> None:
    with pytest.raises(ConfigurationError, match="fair"):
        lock_client.lease("fair", fair="yes")  # type: ignore[arg-type]


def test_newcomer_after_an_expiry_is_marked_by_the_next_refresh_and_hands_over(
    lock_client: LockClient, holder: Lease
) -> None:
    queue_up(lock_client, holder, "a", "t")
    lock_client.redis.delete(holder.keys.lock)  # the holder's lease ran out
    newcomer = lock_client.lease("fair", ttl=30, heartbeat=False)
    assert newcomer.acquire()  # a free name is taken by whoever comes: no hand-off to make
    assert b"waiting" not in holder_of(lock_client, holder)
    assert queue_up(lock_client, holder, "a", "t")[0] is False  # its refresh marks it
    newcomer.release()
    assert holder_of(lock_client, holder)[b"owner"] == b"a"


def test_wait_whose_hand_off_reply_is_lost_takes_the_lease_it_was_handed(
    lock_client: LockClient, holder: Lease
) -> None:
    """The interleaving: a release hands the lease to a waiter blocked in BLPOP, and the
    reply that says so never reaches it (its connection times out). The waiter keeps trying
    within its wait, as the same owner: its next attempt is answered as the holder, so it
    holds (and renews) the lease it was handed, rather than leaving it to run out."""
    port = int(lock_client.redis.connection_pool.connection_kwargs["port"])
    proxy = HoldingProxy(port)
    client = LockClient(
        redis.Redis(port=proxy.port, socket_timeout=1.0, retry=Retry(NoBackoff(), 0)),
        prefix=lock_client.prefix,
    )
    try:
        waiter = client.lease("fair", ttl=30, fair=True)
        blocked = BackgroundAcquire(waiter, wait=20)
        queue = holder.keys.base + b"queue"
        wait_for(lambda: lock_client.redis.llen(queue) == 1, 10, "the waiter to queue")
        wait_for(
            lambda: any(c.get("cmd") == "blpop" for c in lock_client.redis.client_list()),
            10,
            "the waiter to block in BLPOP",
        )
        (owner,) = lock_client.redis.lrange(queue, 0, -1)  # the waiter's owner token
        proxy.hold_next_reply()
        holder.release()  # hands the lease to the waiter
        assert holder_of(lock_client, holder)[b"owner"] == owner
        blocked.finish(20)
        assert blocked.errors == [] and blocked.results == [True]
        assert waiter.held and holder_of(lock_client, holder)[b"owner"] == owner
        assert lock_client.redis.llen(queue) == 0
        waiter.release()
        assert not lock_client.redis.exists(holder.keys.lock)
    finally:
        client.close()
        proxy.close()
