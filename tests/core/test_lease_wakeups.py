"""Waking waiters: a release publishes only when a waiter marked the holder's hash.

Each interleaving is driven step by step through the scripts (no racing threads); a real
pub/sub subscriber on the lock's channel records what the steps published. To tell "nothing
was published" without waiting for a timeout, the test publishes a probe of its own after
the steps: whatever arrives before the probe was published by them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.attempts import try_acquire
from support.pubsub import Channel
from support.waiting import BackgroundAcquire, wait_for, wait_for_subscriber

from celery_singleton_lock import Lease, LockClient
from celery_singleton_lock.core.replies import Reply, acquire_outcome
from celery_singleton_lock.core.scripts import run
from celery_singleton_lock.kinds.lease import packed_lease_holder


@pytest.fixture
def lease(lock_client: LockClient) -> Lease:
    return lock_client.lease("wake", ttl=30, heartbeat=False)


@pytest.fixture
def channel(lock_client: LockClient, lease: Lease) -> Iterator[Channel]:
    subscriber = Channel(lock_client, lease.keys.channel)
    yield subscriber
    subscriber.close()


def attempt(
    client: LockClient, lease: Lease, owner: str, *, waiting: bool, takeover: str = ""
) -> Any:
    """One run of acquire.lua for ``owner`` on ``lease``'s name."""
    taken, value = acquire_outcome(run(client.connection.scripts.acquire_call(
        lease.keys.lock, lease.keys.fence, owner, 30_000, 0,
        packed_lease_holder(lease.name, lease.heartbeat, lease.owner_info),
        takeover, waiting=waiting,
    )))  # fmt: skip
    return taken == Reply.DONE, value


def release(client: LockClient, lease: Lease, owner: str, delay_ms: int = 0) -> int:
    return int(run(client.connection.scripts.release_call(lease.keys.lock, owner, delay_ms)))


def marked(client: LockClient, lease: Lease) -> bool:
    return client.redis.hget(lease.keys.lock, "waiting") is not None


def test_uncontended_release_publishes_nothing(
    lock_client: LockClient, lease: Lease, channel: Channel
) -> None:
    for _ in range(3):
        assert lease.acquire()
        assert not marked(lock_client, lease)
        lease.release()
    assert channel.published() == []


def test_failed_attempt_of_a_waiter_marks_and_release_publishes(
    lock_client: LockClient, lease: Lease, channel: Channel
) -> None:
    assert attempt(lock_client, lease, "holder", waiting=False)[0]
    taken, hint = attempt(lock_client, lease, "waiter", waiting=True)
    assert not taken and 0 < hint <= 30_000
    assert marked(lock_client, lease)
    assert release(lock_client, lease, "holder") == 1
    assert channel.published() == [b"released"]


def test_failed_try_without_wait_does_not_mark(
    lock_client: LockClient, lease: Lease, channel: Channel
) -> None:
    assert attempt(lock_client, lease, "holder", waiting=False)[0]
    assert not attempt(lock_client, lease, "other", waiting=False)[0]
    assert not lock_client.lease("wake").acquire(wait=0)  # a try through the handle alike
    assert not marked(lock_client, lease)
    assert release(lock_client, lease, "holder") == 1
    assert channel.published() == []


def test_release_before_the_waiter_subscribed_is_caught_by_its_retry(
    lock_client: LockClient, lease: Lease
) -> None:
    # The waiter's first attempt marks; the holder releases (the message reaches nobody);
    # then the waiter subscribes and retries, as _wait_for does, and takes the name.
    assert attempt(lock_client, lease, "holder", waiting=False)[0]
    assert not attempt(lock_client, lease, "waiter", waiting=True)[0]
    assert release(lock_client, lease, "holder") == 1
    late = Channel(lock_client, lease.keys.channel)
    try:
        taken, token = attempt(lock_client, lease, "waiter", waiting=True)
        assert taken and token > 0
        assert late.published() == []
    finally:
        late.close()


def test_new_holder_starts_unmarked_and_a_still_waiting_waiter_marks_it(
    lock_client: LockClient, lease: Lease, channel: Channel
) -> None:
    assert attempt(lock_client, lease, "first", waiting=False)[0]
    assert not attempt(lock_client, lease, "waiter", waiting=True)[0]
    assert release(lock_client, lease, "first") == 1
    # Another client takes the name before the woken waiter retries.
    assert attempt(lock_client, lease, "second", waiting=False)[0]
    assert not marked(lock_client, lease)
    assert not attempt(lock_client, lease, "waiter", waiting=True)[0]  # its retry marks again
    assert marked(lock_client, lease)
    assert release(lock_client, lease, "second") == 1
    assert channel.published() == [b"released", b"released"]


def test_renewal_keeps_the_mark(lock_client: LockClient, lease: Lease, channel: Channel) -> None:
    assert lease.acquire()
    owner = lease.owner
    assert owner is not None
    assert not attempt(lock_client, lease, "waiter", waiting=True)[0]
    assert lease.extend(20) > 0
    assert marked(lock_client, lease)
    lease.release()
    assert channel.published() == [b"released"]


def test_release_with_a_delay_publishes_nothing_and_waiters_look_again_when_it_ends(
    lock_client: LockClient, lease: Lease, channel: Channel
) -> None:
    assert attempt(lock_client, lease, "holder", waiting=False)[0]
    assert not attempt(lock_client, lease, "waiter", waiting=True)[0]
    assert release(lock_client, lease, "holder", delay_ms=5_000) == 1
    taken, hint = attempt(lock_client, lease, "waiter", waiting=True)
    assert not taken and 0 < hint <= 5_000  # the waiter sleeps until the release delay ends
    assert channel.published() == []


def test_claim_taken_over_keeps_the_mark(
    lock_client: LockClient, lease: Lease, channel: Channel
) -> None:
    assert attempt(lock_client, lease, "claim:t:0", waiting=False)[0]
    assert not attempt(lock_client, lease, "waiter", waiting=True)[0]
    taken, _ = attempt(lock_client, lease, "worker", waiting=False, takeover="claim:t:0")
    assert taken
    assert lock_client.redis.hget(lease.keys.lock, "owner") == b"worker"
    assert release(lock_client, lease, "worker") == 1
    assert channel.published() == [b"released"]


def test_multi_waiter_marks_a_lease_holder(
    lock_client: LockClient, lease: Lease, channel: Channel
) -> None:
    assert lease.acquire()
    both = lock_client.multi(["wake", "other"], heartbeat=False)
    assert not try_acquire(both, "multi-owner", False)[0]
    assert not marked(lock_client, lease)
    assert not try_acquire(both, "multi-owner", True)[0]
    assert marked(lock_client, lease)
    # The free name was left alone, unmarked and not created.
    assert not lock_client.redis.exists(lock_client.connection.keys("other").lock)
    lease.release()
    assert channel.published() == [b"released"]


def test_blocked_waiter_is_woken_by_the_release(lock_client: LockClient, lease: Lease) -> None:
    assert lease.acquire()
    waiter = lock_client.lease("wake", ttl=30, heartbeat=False)
    blocked = BackgroundAcquire(waiter, wait=25)
    wait_for_subscriber(lock_client, lease.keys.channel)
    assert marked(lock_client, lease)
    released_at = time.monotonic()
    lease.release()
    assert blocked.done.wait(20)
    # Woken by the message, not at its hint (the holder's 30 s lease).
    assert time.monotonic() - released_at < 10
    assert blocked.results == [True] and not blocked.errors
    waiter.release()


def test_waiters_take_the_name_in_turn_each_woken_by_a_release(
    lock_client: LockClient, lease: Lease
) -> None:
    # Only the first holder was marked before its release; each later holder is marked by
    # the failed retries of the waiters still blocked, so its release wakes them too.
    assert lease.acquire()
    waiters = [lock_client.lease("wake", ttl=30, heartbeat=False) for _ in range(3)]
    blocked = [BackgroundAcquire(w, wait=25) for w in waiters]
    wait_for(
        lambda: (
            dict(lock_client.redis.pubsub_numsub(lease.keys.channel)).get(lease.keys.channel, 0)
            >= 1
        ),
        10,
        "the waiters to subscribe",
    )
    lease.release()
    released: list[Lease] = []
    for turn in range(1, 4):
        done = wait_for(
            lambda turn=turn: (
                [b for b in blocked if b.done.is_set()]
                if sum(b.done.is_set() for b in blocked) >= turn
                else None
            ),
            20,
            f"waiter number {turn} to take the name",
        )
        # One at a time: the name is exclusive.
        assert len(done) == turn, [(b.results, b.errors) for b in blocked]
        # Only the waiter this turn saw done is released: the next one may take the name
        # as soon as that release returns, and is the next turn's to see.
        for waiter, background in zip(waiters, blocked, strict=True):
            if background in done and waiter not in released:
                assert background.results == [True] and not background.errors
                waiter.release()
                released.append(waiter)


def test_uncontended_acquire_and_release_are_one_round_trip_each(lock_client: LockClient) -> None:
    plain = lock_client.lease("trips", ttl=30)
    fair = lock_client.lease("trips", ttl=30, fair=True)
    assert plain.acquire()  # loads the scripts
    plain.release()
    sent: list[object] = []
    send = lock_client.redis.execute_command

    def counting(*args: Any, **options: Any) -> Any:
        sent.append(args[0])
        return send(*args, **options)

    lock_client.redis.execute_command = counting
    try:
        for handle in (plain, fair):
            assert handle.acquire(wait=5)  # a caller that would wait, uncontended: one call
            handle.release()
    finally:
        del lock_client.redis.execute_command
    assert sent == ["EVALSHA"] * 4
