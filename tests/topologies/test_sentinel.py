"""Sentinel: a master, a replica and a sentinel on loopback (quick failover settings). The
client made from a ``sentinel://`` URL follows a failover; and the honest limit: replication
is asynchronous, so a lock taken just before the master dies can be lost, two clients then
both "hold" it, and only the fencing token tells their writes apart."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from support.redis_topologies import SENTINEL_MASTER, SentinelSet, wait_until

from celery_singleton_lock import LockClient, LockLost
from celery_singleton_lock.exceptions import LockBackendError

#: A failover here takes down-after (1 s) + election and promotion: a few seconds.
FAILOVER_TIMEOUT = 30


def fail_over(sentinels: SentinelSet) -> int:
    """Kill the master; return the new master's port once the sentinel has promoted the
    replica and the replica answers as a master."""
    old = sentinels.master.port
    sentinels.master.kill()
    new = wait_until(
        lambda: sentinels.master_port() != old and sentinels.master_port(),
        FAILOVER_TIMEOUT,
        "the sentinel to promote the replica",
    )
    node = SentinelSet.node(new)
    try:
        wait_until(
            lambda: node.info("replication").get("role") == "master",
            FAILOVER_TIMEOUT,
            "the promoted replica to act as master",
        )
    finally:
        node.close()
    assert new == sentinels.replica.port
    return int(new)


def acquire_eventually(client: LockClient, name: str, ttl: float = 10) -> object:
    """A lease on ``name``, retried while the client finds its way to the new master."""

    def attempt() -> object:
        lease = client.lease(name, ttl=ttl)
        try:
            return lease if lease.acquire() else None
        except LockBackendError:
            return None

    return wait_until(attempt, FAILOVER_TIMEOUT, f"acquire {name!r} on the new master")


def test_client_follows_a_failover(sentinels: SentinelSet, prefix: str) -> None:
    client = LockClient.from_url(sentinels.url, prefix=prefix)
    try:
        assert client.url == f"sentinel://127.0.0.1:{sentinels.sentinel.port}/{SENTINEL_MASTER}/0"
        kept = client.lease("kept", ttl=10)
        assert kept.acquire()
        before = kept.token
        # Make sure the replica has it before the master dies.
        assert client.redis.execute_command("WAIT", 1, 5000) == 1
        fail_over(sentinels)
        # The client reaches the new master: a new name, waiters woken there, and the lease
        # taken before the failover is still held (it was replicated) and renews there.
        fresh = acquire_eventually(client, "after-failover")
        assert isinstance(fresh.token, int) and before is not None  # type: ignore[attr-defined]
        assert fresh.token > before  # type: ignore[attr-defined]
        assert not client.lease("kept").acquire()
        assert kept.extend() == pytest.approx(10, abs=0.5)
        waiter = client.lease("after-failover", ttl=10)
        got: list[bool] = []
        thread = threading.Thread(target=lambda: got.append(waiter.acquire(wait=20)))
        thread.start()
        channel = client.connection.keys("after-failover").channel
        wait_until(lambda: client.redis.pubsub_numsub(channel)[0][1], 10, "the waiter")
        started = time.monotonic()
        fresh.release()  # type: ignore[attr-defined]
        thread.join(20)
        assert got == [True] and time.monotonic() - started < 2.0
        waiter.release()
        kept.release()
        other = LockClient.from_url(sentinels.url, prefix=prefix)
        try:
            with other.lease("kept", ttl=5) as again:
                assert again.token is not None and again.token > before
        finally:
            other.close()
    finally:
        client.close()


def test_a_waiter_rides_out_a_failover_and_is_woken_on_the_new_master(
    sentinels: SentinelSet, prefix: str
) -> None:
    """A blocked waiter holds nothing, so a failover does not end its wait: its pub/sub
    connection dies with the master and its look-again cannot reach Redis, and it keeps
    trying until the sentinel has promoted the replica; there it finds the name still held (it
    was replicated), subscribes on the new master, and the holder's release there wakes it."""
    holder_client = LockClient.from_url(sentinels.url, prefix=prefix)
    waiter_client = LockClient.from_url(sentinels.url, prefix=prefix)
    waiter_thread = ThreadPoolExecutor(max_workers=1)
    try:
        holder = holder_client.lease("across", ttl=120)
        assert holder.acquire()
        assert holder_client.redis.execute_command("WAIT", 1, 5000) == 1
        waiter = waiter_client.lease("across", ttl=120)
        channel = waiter.keys.channel

        def subscribed() -> int:
            return int(holder_client.redis.pubsub_numsub(channel)[0][1])

        blocked = waiter_thread.submit(waiter.acquire, wait=3 * FAILOVER_TIMEOUT)
        wait_until(subscribed, 10, "the waiter")
        old_port = sentinels.master.port
        fail_over(sentinels)
        wait_until(subscribed, FAILOVER_TIMEOUT, "the waiter on the new master")
        notifier = waiter_client.connection.notifier
        # Reconnected by the listener, which keeps the new connection right after sending
        # the SUBSCRIBE the new master already counts: it may not have got there yet.
        listener = wait_until(lambda: notifier.connection, 10, "the listener's new connection")
        assert listener.port != old_port
        assert not blocked.done()  # still waiting: the name is still held there
        released = time.monotonic()
        holder.release()
        assert blocked.result(timeout=FAILOVER_TIMEOUT) is True
        assert time.monotonic() - released < 10  # woken by the release, not the 120 s lease
        assert waiter.token is not None and holder.token is not None
        assert waiter.token > holder.token
        waiter.release()
    finally:
        waiter_thread.shutdown(wait=False)
        holder_client.close()
        waiter_client.close()


class FencedStore:
    """Storage that rejects a write carrying a smaller fencing token than it has seen."""

    def __init__(self) -> None:
        self.highest = 0
        self.value: str | None = None

    def write(self, token: int, value: str) -> bool:
        if token < self.highest:
            return False
        self.highest, self.value = token, value
        return True


def test_failover_can_lose_a_fresh_lock_and_fencing_tokens_tell(
    sentinels: SentinelSet, prefix: str
) -> None:
    # Cut replication: the replica may no longer sync from the master (ACL), and its link is
    # dropped. What the master takes from now on is never replicated.
    master = SentinelSet.node(sentinels.master.port)
    replica = SentinelSet.node(sentinels.replica.port)
    master.execute_command("ACL", "SETUSER", "default", "-psync", "-sync", "-replconf")
    master.execute_command("CLIENT", "KILL", "TYPE", "replica")
    wait_until(
        lambda: replica.info("replication").get("master_link_status") == "down",
        10,
        "the replica's link to go down",
    )
    master.close()
    first = LockClient.from_url(sentinels.url, prefix=prefix)
    second = LockClient.from_url(sentinels.url, prefix=prefix)
    lost = threading.Event()
    try:
        stale = first.lease("report", ttl=10, on_lost=lambda _: lost.set())
        assert stale.acquire()
        assert stale.token is not None
        assert replica.exists(first.connection.keys("report").lock) == 0  # not replicated
        fail_over(sentinels)
        # The new master never saw the lock: a second client takes the same name.
        fresh = acquire_eventually(second, "report")
        # The first holder may not know yet: its heartbeat finds out at its next renewal on
        # the new master (sooner if a renewal failed during the failover and is retried).
        # Either way, fencing tokens tell the two holders' writes apart.
        # Tokens are seeded from the server clock in microseconds: the lost fence counter
        # does not matter, the new holder's token is larger (one machine, one clock here;
        # across machines, as long as the clocks agree within the failover time).
        assert fresh.token > stale.token  # type: ignore[attr-defined]
        store = FencedStore()
        assert store.write(fresh.token, "new holder")  # type: ignore[attr-defined]
        assert not store.write(stale.token, "stale holder")
        assert store.value == "new holder"
        # And the first holder's heartbeat finds its lease gone or taken on the new master.
        assert lost.wait(FAILOVER_TIMEOUT)
        with pytest.raises(LockLost):
            stale.check()
        fresh.release()  # type: ignore[attr-defined]
    finally:
        replica.close()
        first.close()
        second.close()


def test_sentinel_password_stays_out(sentinels: SentinelSet, prefix: str) -> None:
    # The master's login travels in the URL; requirepass on the master (the sentinel is
    # open) shows the login reaches the master and nowhere else.
    secret = "pw-" + uuid.uuid4().hex
    master = redis.Redis(port=sentinels.master.port)
    master.config_set("requirepass", secret)
    master.close()
    url = f"sentinel://:{secret}@127.0.0.1:{sentinels.sentinel.port}/{SENTINEL_MASTER}"
    client = LockClient.from_url(url, prefix=prefix)
    try:
        assert secret not in client.url and secret not in repr(client)
        with client.lease("guarded", ttl=5) as lease:
            assert lease.held
        wrong = LockClient.from_url(url.replace(secret, secret + "x"), prefix=prefix)
        with pytest.raises(LockBackendError) as refused:
            wrong.ping()
        assert secret not in str(refused.value)
        wrong.close()
    finally:
        client.close()
