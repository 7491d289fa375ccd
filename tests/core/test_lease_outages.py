"""Exclusive lease while its Redis crashes and restarts (empty: nothing is persisted)."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from support.waiting import BackgroundAcquire, wait_for_subscriber

from celery_singleton_lock import Lease, LockBackendError, LockClient, LockExpired, LockNotHeld
from celery_singleton_lock.client import mask_password
from celery_singleton_lock.core.heartbeat import heartbeat
from celery_singleton_lock.embedded import RedisServer

PASSWORD = "s3cret-" + uuid.uuid4().hex[:8]


@pytest.fixture
def client(restartable_redis: RedisServer) -> Iterator[LockClient]:
    client = LockClient.from_url(restartable_redis.url, prefix="outage:")
    yield client
    client.close()


def lost_event(lease: Lease) -> threading.Event:
    """An Event the lease's ``on_lost`` sets."""
    event = threading.Event()
    lease.on_lost = lambda _: event.set()
    return event


@pytest.mark.timeout(60)
def test_errors_while_redis_is_down_name_the_server_without_its_password() -> None:
    with RedisServer(password=PASSWORD) as server:
        assert PASSWORD in server.url
        client = LockClient.from_url(server.url, prefix="pw:")
        held = client.lease("held", ttl=30)
        assert held.acquire()
        releasing = client.lease("releasing", ttl=30)
        assert releasing.acquire()
        assert PASSWORD not in repr(client) and PASSWORD not in client.url
        server.stop()

        held.check()  # no round trip: still fine, the lease has not run out
        assert held.held and not held.lost
        errors = []
        for call in (client.lease("other").acquire, releasing.release, held.extend, client.ping):
            with pytest.raises(LockBackendError) as info:
                call()
            errors.append(info.value)
        for error in errors:
            text = str(error)
            assert f"127.0.0.1:{server.port}" in text
            assert PASSWORD not in text
            assert PASSWORD not in repr(error)
            assert PASSWORD not in str(error.__cause__)
        assert PASSWORD not in repr(held)
        heartbeat().remove(held)
        client.close()


def test_mask_password() -> None:
    assert mask_password("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert mask_password("redis://user:pw@h/0") == "redis://user:***@h/0"
    assert mask_password("redis://h:1/0") == "redis://h:1/0"
    assert "pw" not in mask_password("redis://:pw@h:notaport/0")
    assert "pw" not in mask_password("redis://:pw@[::1/0")


@pytest.mark.timeout(60)
def test_short_outage_that_empties_redis_is_detected_at_the_next_tick(
    client: LockClient, restartable_redis: RedisServer
) -> None:
    ttl = 3.0
    lease = client.lease("blip", ttl=ttl)
    lost = lost_event(lease)
    assert lease.acquire()
    acquired_at = time.monotonic()
    restartable_redis.stop()
    restartable_redis.start()  # back, but empty: the lease is gone
    assert lost.wait(ttl + 5)
    # Found by a renewal (gone), not by the lease running out locally.
    assert time.monotonic() - acquired_at < ttl
    assert lease.lost and not lease.held
    with pytest.raises(LockExpired) as info:
        lease.check()
    assert info.value.reason == "expired"
    # The name is free again for anyone.
    other = client.lease("blip")
    assert other.acquire()
    other.release()


@pytest.mark.timeout(60)
def test_long_outage_marks_the_lease_lost_as_unreachable_and_the_heartbeat_survives(
    client: LockClient, restartable_redis: RedisServer
) -> None:
    ttl = 1.0
    lease = client.lease("outage", ttl=ttl)
    lost = lost_event(lease)
    assert lease.acquire()
    restartable_redis.stop()
    stopped_at = time.monotonic()
    assert lost.wait(ttl + 5)
    assert time.monotonic() - stopped_at >= ttl * 0.6  # not before the lease could run out
    with pytest.raises(LockExpired) as info:
        lease.check()
    assert info.value.reason == "unreachable"
    assert heartbeat().running

    restartable_redis.start()
    fresh = client.lease("after", ttl=0.5)
    assert fresh.acquire()
    token = fresh.token
    ticks = heartbeat().ticks
    deadline = time.monotonic() + 2.0  # four ttls
    while time.monotonic() < deadline:
        fresh.check()
        assert int(client.redis.hget(fresh.keys.lock, "token")) == token
        time.sleep(0.05)
    assert heartbeat().ticks >= ticks + 4
    fresh.release()


@pytest.mark.timeout(60)
def test_waiter_blocked_during_a_restart_rides_it_out_and_the_client_recovers(
    client: LockClient, restartable_redis: RedisServer
) -> None:
    holder = client.lease("busy", ttl=30)
    assert holder.acquire()
    waiter = client.lease("busy")
    waiting = BackgroundAcquire(waiter, wait=30)
    wait_for_subscriber(client, waiter.keys.channel)
    restartable_redis.stop()
    # A waiter holds nothing: it keeps trying through the outage, within its 30 s wait...
    assert not waiting.done.wait(1.0)
    restartable_redis.start()  # ...and the restarted server (empty: nothing persisted) has
    waiting.finish(20)  # the name free, so it takes it there.
    assert waiting.errors == [] and waiting.results == [True]
    assert waiter.held and waiter.token is not None
    waiter.release()
    heartbeat().remove(holder)

    # A waiter whose wait runs out while Redis is down says Redis did not answer.
    holder = client.lease("busy", ttl=30)
    assert holder.acquire()
    late = BackgroundAcquire(client.lease("busy"), wait=1.5)
    wait_for_subscriber(client, holder.keys.channel)
    restartable_redis.stop()
    late.finish(10)
    assert len(late.errors) == 1 and isinstance(late.errors[0], LockBackendError), late.errors
    heartbeat().remove(holder)

    # After the restart the same client takes locks and its pub/sub listener is back: a new
    # waiter is woken by a release, far sooner than the holder's 30 s lease.
    restartable_redis.start()
    holder = client.lease("busy", ttl=30)
    assert holder.acquire()
    got = threading.Event()
    second = client.lease("busy")
    thread = threading.Thread(target=lambda: second.acquire(wait=20) and got.set())
    thread.start()
    wait_for_subscriber(client, second.keys.channel)
    released_at = time.monotonic()
    holder.release()
    assert got.wait(10)
    assert time.monotonic() - released_at < 2.0
    thread.join(5)
    second.release()


@pytest.mark.timeout(60)
def test_scripts_are_reloaded_on_a_fresh_server(
    client: LockClient, restartable_redis: RedisServer
) -> None:
    first = client.lease("a", ttl=0.6)
    assert first.acquire()
    first.release()
    restartable_redis.stop()
    restartable_redis.start()
    script, _, _ = client.connection.scripts.release_call(b"any", "owner", 0)
    assert client.redis.script_exists(script.sha) == [False]
    lease = client.lease("a", ttl=0.6)
    assert lease.acquire()
    assert lease.extend() == pytest.approx(0.6)
    lease.release()
    # The heartbeat's renewal of several leases in one call reloads them too.
    leases = [client.lease(f"batch{i}", ttl=0.5) for i in range(3)]
    for lease in leases:
        assert lease.acquire()
    client.redis.script_flush()
    deadline = time.monotonic() + 1.5  # three ttls
    while time.monotonic() < deadline:
        for lease in leases:
            lease.check()
        time.sleep(0.05)
    for lease in leases:
        lease.release()


@pytest.mark.timeout(60)
def test_a_frozen_redis_does_not_stall_the_heartbeat(restartable_redis: RedisServer) -> None:
    """A Redis that stops answering without closing its sockets (SIGSTOP: a hung or
    partitioned server): calls time out, the lease is marked lost once it could have run
    out, and the heartbeat thread renews again when Redis answers."""
    client = LockClient.from_url(restartable_redis.url, prefix="frozen:", socket_timeout=0.3)
    try:
        lease = client.lease("held", ttl=1.0)
        lost = lost_event(lease)
        assert lease.acquire()
        assert restartable_redis.process is not None
        pid = restartable_redis.process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            assert lost.wait(20), "the lease was never marked lost while Redis was frozen"
            assert lease.lost
        finally:
            os.kill(pid, signal.SIGCONT)
        fresh = client.lease("fresh", ttl=0.6)
        assert fresh.acquire()
        ticks = heartbeat().ticks
        deadline = time.monotonic() + 10
        while heartbeat().ticks < ticks + 4:  # several renewals of a 0.6 s lease
            assert time.monotonic() < deadline, "the heartbeat did not tick after the freeze"
            time.sleep(0.05)
        assert fresh.held
        fresh.release()
    finally:
        client.close()


def test_from_url_sets_a_socket_timeout() -> None:
    client = LockClient.from_url("redis://127.0.0.1:1/0")
    kwargs = client.redis.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 5.0
    assert kwargs["socket_connect_timeout"] == 5.0
    explicit = LockClient.from_url("redis://127.0.0.1:1/0?socket_timeout=2")
    assert explicit.redis.connection_pool.connection_kwargs["socket_timeout"] == 2.0


@pytest.mark.timeout(60)
def test_a_release_that_redis_did_not_answer_can_be_retried(
    restartable_redis: RedisServer,
) -> None:
    """release() during a freeze raises LockBackendError and keeps the owner token (the
    lock is still there, no longer renewed); once Redis answers, release() again frees it."""
    client = LockClient.from_url(restartable_redis.url, prefix="retry:", socket_timeout=0.3)
    try:
        lease = client.lease("held", ttl=30.0)
        assert lease.acquire()
        key = lease.keys.lock
        assert restartable_redis.process is not None
        pid = restartable_redis.process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(LockBackendError):
                lease.release()
        finally:
            os.kill(pid, signal.SIGCONT)
        assert lease.held
        assert not heartbeat().holds(lease), "a lease whose release failed is still renewed"
        assert client.redis.exists(key) == 1
        lease.release()
        assert client.redis.exists(key) == 0
        assert not lease.held
        with pytest.raises(LockNotHeld):
            lease.release()
    finally:
        client.close()
