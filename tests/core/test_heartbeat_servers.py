"""The heartbeat with leases on several Redis servers: one that stops answering must not cost
the leases held on another."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.forked import FORKS_WITH_THREADS, run_in_child

from celery_singleton_lock import LockClient, LockExpired
from celery_singleton_lock.core import heartbeat as heartbeat_module
from celery_singleton_lock.core.heartbeat import Heartbeat, heartbeat
from celery_singleton_lock.embedded import RedisServer

#: Long enough that the tests' own renewals, not the ttl, decide what the server holds.
LONG_TTL = 30.0


@pytest.fixture
def other_client(restartable_redis: RedisServer, lock_prefix: str) -> Iterator[LockClient]:
    """A client on a second, private server (``lock_client`` is on the shared one)."""
    client = LockClient.from_url(restartable_redis.url, prefix=lock_prefix)
    yield client
    client.close()


def shorten(client: LockClient, lease: Any) -> None:
    """Leave the lease 5 s on the server, so a renewal shows as a longer PTTL."""
    assert client.redis.pexpire(lease.keys.lock, 5000)


def renewed(client: LockClient, lease: Any) -> bool:
    return int(client.redis.pttl(lease.keys.lock)) > 20_000


def spy_on_renewals(monkeypatch: pytest.MonkeyPatch, *leases: Any) -> list[threading.Thread]:
    """The threads each heartbeat batch renewing one of ``leases`` ran on (its one round
    trip), in the order they started."""
    threads: list[threading.Thread] = []
    run_batch = heartbeat_module.run_batch
    owners = {lease.owner for lease in leases}

    def spy(redis: Any, calls: Any, *replication: Any) -> Any:
        if owners & {arg for _, _, args in calls for arg in args if isinstance(arg, str)}:
            threads.append(threading.current_thread())
        return run_batch(redis, calls, *replication)

    monkeypatch.setattr(heartbeat_module, "run_batch", spy)
    return threads


def renewer_threads() -> list[threading.Thread]:
    """The heartbeat's renewal threads of this process (one per client renewed at once)."""
    return [t for t in threading.enumerate() if t.name == "celery_singleton_lock-renewer"]


@pytest.mark.timeout(60)
def test_a_frozen_server_does_not_cost_the_leases_on_another(
    lock_client: LockClient, restartable_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ttl = 0.9
    # Its calls block for longer than a whole lease on the healthy server lasts.
    frozen = LockClient.from_url(restartable_redis.url, prefix="frozen:", socket_timeout=1.5)
    # How many batches for the frozen server are in flight at once: the heartbeat must
    # skip a client whose batch has not returned rather than pile more on.
    in_flight, most, counting = 0, 0, threading.Lock()
    call = frozen.connection.call

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal in_flight, most
        with counting:
            in_flight += 1
            most = max(most, in_flight)
        try:
            return call(*args, **kwargs)
        finally:
            with counting:
                in_flight -= 1

    monkeypatch.setattr(frozen.connection, "call", counted)
    try:
        a_lost, b_lost = threading.Event(), threading.Event()
        lease_a = lock_client.lease("healthy", ttl=ttl, on_lost=lambda _: a_lost.set())
        lease_b = frozen.lease("frozen", ttl=ttl, on_lost=lambda _: b_lost.set())
        assert lease_a.acquire() and lease_b.acquire()
        token = lease_a.token
        assert restartable_redis.process is not None
        pid = restartable_redis.process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            stopped_at = time.monotonic()
            # Time passing is what is tested: four ttls of the healthy lease, each renewal of
            # it due while the frozen server's calls hang.
            while time.monotonic() - stopped_at < 4 * ttl:
                lease_a.check()
                time.sleep(0.05)
            assert lease_a.held and not a_lost.is_set()
            assert b_lost.wait(20), "the lease on the frozen server was never marked lost"
            assert lease_b.lost and not lease_b.held
            with pytest.raises(LockExpired) as info:
                lease_b.check()
            assert info.value.reason == "unreachable"
            # Still renewed after the frozen server's call timed out, and still ours there.
            lease_a.check()
            assert lease_a.held and not a_lost.is_set()
            assert int(lock_client.redis.hget(lease_a.keys.lock, "token")) == token
            assert lock_client.redis.pttl(lease_a.keys.lock) > 0
        finally:
            os.kill(pid, signal.SIGCONT)
        with counting:
            assert most == 1, f"{most} renewals of the frozen server were in flight at once"
        lease_a.release()
    finally:
        frozen.close()


def test_a_tick_with_one_client_renews_on_the_calling_thread_and_starts_none(
    lock_client: LockClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    beat = Heartbeat()  # not the process's: only this test's lease is registered
    lease = lock_client.lease("single", ttl=LONG_TTL, heartbeat=False)
    assert lease.acquire()
    try:
        beat.add(lease)  # starts the heartbeat's own thread, which waits LONG_TTL / 3
        ran_on = spy_on_renewals(monkeypatch, lease)
        shorten(lock_client, lease)
        before = set(threading.enumerate())
        beat.tick()
        assert set(threading.enumerate()) == before  # no renewal thread made
        assert ran_on == [threading.current_thread()]
        assert renewed(lock_client, lease)
    finally:
        beat.stop()
        lease.release()


def test_a_tick_with_two_clients_renews_both_concurrently_and_waits_for_them(
    lock_client: LockClient, other_client: LockClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    beat = Heartbeat()
    clients = [lock_client, other_client]
    leases = [client.lease("pair", ttl=LONG_TTL, heartbeat=False) for client in clients]
    try:
        for lease in leases:
            assert lease.acquire()
            beat.add(lease)
        ran_on = spy_on_renewals(monkeypatch, *leases)
        for client, lease in zip(clients, leases, strict=True):
            shorten(client, lease)
        beat.tick()
        # Applied when tick() returns, both of them.
        assert all(renewed(*pair) for pair in zip(clients, leases, strict=True))
        # One batch on the caller, which waits anyway; the other on a renewal thread.
        assert len(ran_on) == 2 and threading.current_thread() in ran_on, ran_on
        (worker,) = (thread for thread in ran_on if thread is not threading.current_thread())
        assert worker.name == "celery_singleton_lock-renewer" and worker.daemon
    finally:
        beat.stop()
        for lease in leases:
            lease.release()
    assert not worker.is_alive()  # stop() ends the renewal threads


def _child(clients: list[LockClient]) -> dict[str, Any]:
    """Runs in the forked child; returns what it found."""
    report: dict[str, Any] = {"no_renewer_yet": renewer_threads() == []}
    leases = [client.lease("child", ttl=LONG_TTL) for client in clients]
    for client, lease in zip(clients, leases, strict=True):
        assert lease.acquire()
        shorten(client, lease)
    heartbeat().tick()
    report["renewed"] = [renewed(*pair) for pair in zip(clients, leases, strict=True)]
    report["renewers_made"] = renewer_threads() != []
    for lease in leases:
        lease.release()
    return report


@pytest.mark.timeout(60)
@FORKS_WITH_THREADS
def test_a_forked_child_renews_on_two_clients_with_its_own_threads(
    lock_client: LockClient, other_client: LockClient
) -> None:
    clients = [lock_client, other_client]
    leases = [client.lease("parent", ttl=LONG_TTL) for client in clients]
    for lease in leases:
        assert lease.acquire()
    heartbeat().tick()  # two clients: the parent now has renewal threads
    assert renewer_threads() != []
    # A renewal waiting on a thread the child does not have would hang: end instead.
    report = run_in_child(lambda: _child(clients), alarm=30)
    assert report == {"no_renewer_yet": True, "renewed": [True, True], "renewers_made": True}
    for lease in leases:
        lease.check()
        lease.release()
