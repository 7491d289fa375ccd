"""Exclusive lease: the single-process contract (a lost lease stays lost, and is reported
once)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.waiting import wait_for

from celery_singleton_lock import (
    LockClient,
    LockExpired,
    LockNotHeld,
    LockTaken,
    LockTimeout,
)
from celery_singleton_lock.core.heartbeat import heartbeat
from celery_singleton_lock.embedded import RedisServer


def test_second_acquire_refused_until_release(lock_client: LockClient) -> None:
    first, second = lock_client.lease("job"), lock_client.lease("job")
    assert first.acquire()
    assert first.held
    assert not second.acquire()
    first.release()
    assert not first.held
    assert second.acquire()
    second.release()


def test_tokens_strictly_increase_across_release_expiry_and_clear(lock_client: LockClient) -> None:
    tokens = []
    for _ in range(5):
        with lock_client.lease("fenced") as lease:
            tokens.append(lease.token)
    expiring = lock_client.lease("fenced", ttl=0.05, heartbeat=False)
    assert expiring.acquire()
    tokens.append(expiring.token)
    lock_client.redis.delete(expiring.keys.lock, expiring.keys.fence)  # cleared by hand
    with lock_client.lease("fenced") as lease:
        tokens.append(lease.token)
    assert all(isinstance(t, int) for t in tokens)
    assert tokens == sorted(set(tokens)), tokens


def test_release_of_lost_lease_raises_and_keeps_new_owner(lock_client: LockClient) -> None:
    old = lock_client.lease("k", ttl=0.05, heartbeat=False)
    assert old.acquire()
    new = lock_client.lease("k")
    assert new.acquire(wait=2)
    with pytest.raises(LockTaken):
        old.release()
    assert lock_client.redis.hget(new.keys.lock, "owner") == new.owner.encode()
    new.release()


def test_release_after_expiry_with_nobody_holding_raises_expired(lock_client: LockClient) -> None:
    lease = lock_client.lease("k", ttl=0.05, heartbeat=False)
    assert lease.acquire()
    lock_client.redis.delete(lease.keys.lock)
    with pytest.raises(LockExpired):
        lease.release()


def test_heartbeat_keeps_short_lease_alive(lock_client: LockClient) -> None:
    lease = lock_client.lease("hb", ttl=0.3)
    assert lease.acquire()
    ticks = heartbeat().ticks
    deadline = time.monotonic() + 1.5  # five ttls
    while time.monotonic() < deadline:
        assert lock_client.redis.exists(lease.keys.lock)
        lease.check()
        time.sleep(0.05)
    assert heartbeat().ticks >= ticks + 4
    assert not lock_client.lease("hb").acquire()
    lease.release()


def test_without_heartbeat_the_lease_runs_out(lock_client: LockClient) -> None:
    lease = lock_client.lease("nohb", ttl=0.1, heartbeat=False)
    assert lease.acquire()
    other = lock_client.lease("nohb")
    assert other.acquire(wait=2)
    assert lease.lost
    with pytest.raises(LockExpired):
        lease.check()
    other.release()


def test_max_hold_stops_renewal(lock_client: LockClient) -> None:
    lease = lock_client.lease("capped", ttl=0.2, max_hold=0.4)
    assert lease.acquire()
    started = time.monotonic()
    other = lock_client.lease("capped")
    assert other.acquire(wait=3)
    assert 0.35 <= time.monotonic() - started < 2.0
    other.release()


def test_extend_sets_rather_than_adds(lock_client: LockClient) -> None:
    lease = lock_client.lease("ext", ttl=10, heartbeat=False)
    assert lease.acquire()
    for _ in range(5):
        assert lease.extend(2) == pytest.approx(2.0)
    assert lock_client.redis.pttl(lease.keys.lock) <= 2000
    lease.release()


def test_extend_by_non_owner_raises_and_changes_nothing(lock_client: LockClient) -> None:
    old = lock_client.lease("ext2", ttl=0.05, heartbeat=False)
    assert old.acquire()
    # No heartbeat: a renewal between the two reads would set its time back up.
    new = lock_client.lease("ext2", ttl=5, heartbeat=False)
    assert new.acquire(wait=2)
    pttl = lock_client.redis.pttl(new.keys.lock)
    with pytest.raises(LockTaken):
        old.extend(100)
    assert lock_client.redis.pttl(new.keys.lock) <= pttl
    new.release()


def test_release_delay_keeps_name_locked(lock_client: LockClient) -> None:
    lease = lock_client.lease("report")
    assert lease.acquire()
    lease.release(delay=0.5)
    released = time.monotonic()
    other = lock_client.lease("report")
    assert not other.acquire()
    assert other.acquire(wait=5)
    assert time.monotonic() - released >= 0.45
    other.release()


def test_waiter_wakes_promptly_on_release(lock_client: LockClient) -> None:
    holder = lock_client.lease("handoff", ttl=30)
    assert holder.acquire()
    got = threading.Event()
    acquired_at: list[float] = []

    def wait_for_it() -> None:
        waiter = lock_client.lease("handoff")
        assert waiter.acquire(wait=20)
        acquired_at.append(time.monotonic())
        got.set()
        waiter.release()

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    time.sleep(0.3)  # let the waiter block (nothing to await: it is inside acquire)
    released_at = time.monotonic()
    holder.release()
    assert got.wait(10)
    thread.join()
    # Far below the 30 s lease: the waiter was woken by the release, not by its hint.
    assert acquired_at[0] - released_at < 1.0


def test_waiter_gives_up_on_time(lock_client: LockClient) -> None:
    holder = lock_client.lease("busy", ttl=30)
    assert holder.acquire()
    started = time.monotonic()
    assert not lock_client.lease("busy").acquire(wait=0.5)
    assert 0.5 <= time.monotonic() - started < 1.5
    holder.release()


def test_context_manager_raises_timeout(lock_client: LockClient) -> None:
    holder = lock_client.lease("ctx")
    assert holder.acquire()
    with pytest.raises(LockTimeout) as info, lock_client.lease("ctx", wait=0.1):
        pass
    assert info.value.name == "ctx"
    holder.release()


def test_release_without_acquire_raises(lock_client: LockClient) -> None:
    with pytest.raises(LockNotHeld):
        lock_client.lease("never").release()


def test_names_of_any_length_and_charset(lock_client: LockClient) -> None:
    for name in ["a", "x" * 10_000, "{braces}", "#hash", "üñí\u2603", "nul\x00byte", "\ud800"]:
        lease = lock_client.lease(name)
        assert lease.acquire(), name
        assert not lock_client.lease(name).acquire(), name
        lease.release()


def test_every_key_expires(lock_client: LockClient) -> None:
    lease = lock_client.lease("exp")
    assert lease.acquire()
    lease.release(delay=5)
    # The locks' keys (in hash tags): the prefix's key layout record is meant to stay.
    keys = lock_client.redis.keys(lock_client.prefix + "{*")
    assert keys
    assert all(lock_client.redis.pttl(key) > 0 for key in keys)


def test_wait_forever_is_accepted(lock_client: LockClient) -> None:
    lease = lock_client.lease("inf", wait=math.inf)
    with lease:
        assert lease.held


def script_calls(client: LockClient) -> int:
    """How many scripts the server has run (INFO commandstats): a round-trip counter for a
    server that nothing else talks to."""
    stats = client.redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


@pytest.fixture
def private_client() -> Iterator[LockClient]:
    """A client on a server of its own, so its command statistics are this test's alone."""
    with RedisServer() as server:
        client = LockClient.from_url(server.url, prefix="basics:")
        yield client
        client.close()


# -- a lost lease stays lost ---------------------------------------------------------------------


def test_extend_on_a_lost_handle_raises_with_no_round_trip_and_no_renewal(
    private_client: LockClient,
) -> None:
    """A handle found lost stays lost: extend raises the stored LockLost at once, sends
    nothing, and does not put the handle back on the heartbeat, even when the key it held
    happens to be still there with its owner (a renewal that reached Redis too late)."""
    lease = private_client.lease("report", ttl=0.3)
    assert lease.acquire()
    heartbeat().remove(lease)  # as if the process was paused: no renewal from now on
    private_client.redis.pexpire(lease.keys.lock, 60_000)  # the key outlives the lease
    wait_for(lambda: lease.lost, 10, "the lease to run out locally")
    with pytest.raises(LockExpired) as found:
        lease.check()
    before = script_calls(private_client)

    with pytest.raises(LockExpired) as extended:
        lease.extend(5.0)
    assert extended.value is found.value
    assert not heartbeat().holds(lease)
    assert script_calls(private_client) == before
    with pytest.raises(LockExpired):
        lease.extend()
    assert not heartbeat().holds(lease) and lease.lost


def test_a_release_that_finds_the_lock_lost_calls_on_lost_once(lock_client: LockClient) -> None:
    """A loss no renewal noticed (heartbeat starved, process paused) is reported by the
    release that finds it: on_lost fires there, once, and never again."""
    calls: list[Any] = []
    lease = lock_client.lease("found-at-release", ttl=30, heartbeat=False, on_lost=calls.append)
    assert lease.acquire()
    lock_client.redis.delete(lease.keys.lock)  # expired unnoticed
    with pytest.raises(LockExpired):
        lease.release()
    assert calls == [lease] and lease.lost
    # A lock already found lost (by a renewal) is not reported twice by its release.
    marked: list[Any] = []
    other = lock_client.lease("found-by-renewal", ttl=30, on_lost=marked.append)
    assert other.acquire()
    lock_client.redis.delete(other.keys.lock)
    heartbeat().tick()
    assert marked == [other]
    with pytest.raises(LockExpired):
        other.release()
    assert marked == [other]
