"""Replicated locks (``replicas=N``) for every lock kind beyond the lease: reader-writer and
range holds, semaphore permits, multi-key locks on one server. On a real master, replica and
sentinel: an acquire the replica cannot have is undone and raised, nothing held; a release
(or an upgrade, downgrade, shrink) the replica did not acknowledge happened on the master,
the handle says so, then raises; a hold acknowledged survives a failover."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
import redis
import redis.asyncio
from support.redis_topologies import SentinelSet, wait_until
from test_replicated import acknowledged_write, blocked_clients, cut_replication
from test_sentinel import FAILOVER_TIMEOUT, fail_over

from celery_singleton_lock import (
    AsyncLockClient,
    ConfigurationError,
    LockBackendError,
    LockClient,
    LockNotHeld,
    LockNotReplicated,
)
from celery_singleton_lock.core.heartbeat import heartbeat
from celery_singleton_lock.kinds import rwlock

#: A lock kind: (the hold a test takes, a rival hold of another client it keeps out), each
#: made on the client given.
Kind = tuple[Callable[[LockClient], Any], Callable[[LockClient], Any]]

KINDS: dict[str, Kind] = {
    "write": (
        lambda client: client.rwlock("rw-write").write(ttl=30),
        lambda client: client.rwlock("rw-write").read(ttl=5),
    ),
    "read": (
        lambda client: client.rwlock("rw-read").read(ttl=30),
        lambda client: client.rwlock("rw-read").write(ttl=5),
    ),
    "range": (
        lambda client: client.range_lock("range").write(0, 10, ttl=30),
        lambda client: client.range_lock("range").read(5, 15, ttl=5),
    ),
    "permit": (
        lambda client: client.semaphore("sem", 1).permit(ttl=30),
        lambda client: client.semaphore("sem", 1).permit(ttl=5),
    ),
    "multi": (
        lambda client: client.multi(["m1", "m2"], ttl=30),
        lambda client: client.multi(["m2", "m3"], ttl=5),
    ),
}


@pytest.fixture
def acknowledging(sentinels: SentinelSet) -> SentinelSet:
    """A master, a replica and a sentinel, once the replica acknowledges the master's
    writes (a replica that just synced is sent writes after its first ACK)."""
    wait_for_acknowledgements(sentinels)
    return sentinels


def wait_for_acknowledgements(sentinels: SentinelSet) -> None:
    master = SentinelSet.node(sentinels.master.port)
    try:
        wait_until(lambda: acknowledged_write(master), 20, "the replica to acknowledge")
    finally:
        master.close()


@contextmanager
def replica_paused(sentinels: SentinelSet) -> Iterator[None]:
    """The replica stopped (SIGSTOP: it acknowledges nothing), then resumed and
    acknowledging again."""
    replica = sentinels.replica.process
    assert replica is not None
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    wait_for_acknowledgements(sentinels)


def takes(rival: Any) -> bool:
    """Whether ``rival`` acquires at once (and then gives it back)."""
    if not rival.acquire():
        return False
    rival.release()
    return True


def test_acquires_the_replica_cannot_have_are_undone_and_raised(
    acknowledging: SentinelSet, prefix: str
) -> None:
    """The replica paused: each kind's acquire runs on the master, is not acknowledged, and
    is undone there before it raises; another client takes the lock at once, on the master
    while the replica is paused, and through a replicated client once it is back (the
    replica then has the acquire and its undo)."""
    client = LockClient.from_url(acknowledging.url, prefix=prefix, replicas=1, replica_timeout=0.1)
    plain = LockClient.from_url(acknowledging.url, prefix=prefix)
    try:
        with replica_paused(acknowledging):
            for kind, (make, rival) in KINDS.items():
                hold = make(client)
                with pytest.raises(LockNotReplicated, match=r"not replicated to 1 replica\(s\)"):
                    hold.acquire()
                assert not hold.held, kind
                assert takes(rival(plain)), kind
        for kind, (_, rival) in KINDS.items():
            assert takes(rival(client)), kind
    finally:
        client.close()
        plain.close()


def test_a_blocked_acquire_keeps_trying_while_the_replica_does_not_acknowledge(
    acknowledging: SentinelSet, prefix: str
) -> None:
    """A write hold waits for another client's reader. The replica is paused, the reader
    leaves: the writer takes the lock on the master, which the replica does not acknowledge,
    so it keeps trying within its wait (as the same owner) and returns once the replica is
    back and acknowledges it."""
    client = LockClient.from_url(acknowledging.url, prefix=prefix, replicas=1, replica_timeout=0.1)
    plain = LockClient.from_url(acknowledging.url, prefix=prefix)
    reader = plain.rwlock("blocked").read(ttl=30)
    writer = client.rwlock("blocked").write(ttl=30)
    pool = ThreadPoolExecutor(max_workers=1)
    master = SentinelSet.node(acknowledging.master.port)
    try:
        assert reader.acquire()
        acquired = pool.submit(writer.acquire, 20)
        wait_until(
            lambda: any(holder.waiting for holder in reader.holders()), 10, "the writer to queue"
        )
        with replica_paused(acknowledging):
            reader.release()
            # Taken on the master (its holder hash is there), not acknowledged: still trying.
            wait_until(lambda: holds_on(master, writer), 10, "the writer's hold on the master")
            assert not acquired.done()
        assert acquired.result(timeout=20) is True
        assert writer.held
        writer.release()
    finally:
        pool.shutdown(wait=False)
        master.close()
        client.close()
        plain.close()


def holds_on(master: redis.Redis, writer: Any) -> bool:
    """Whether ``master`` has one hold of ``writer``'s lock, with its holder hash."""
    owners = rwlock.lock_owners(master.hgetall(writer.keys.lock))
    return len(owners) == 1 and master.exists(writer.keys.holder(owners[0])) == 1


def test_releases_and_changes_the_replica_did_not_acknowledge(
    acknowledging: SentinelSet, prefix: str
) -> None:
    """Taken while replicated, then replication is cut. A release happened on the master:
    the handle no longer holds (a second release raises LockNotHeld) and then it raises
    LockNotReplicated. An upgrade, downgrade or shrink likewise: the handle is upgraded,
    downgraded, shrunk, as on the master, then it raises."""
    client = LockClient.from_url(acknowledging.url, prefix=prefix, replicas=1, replica_timeout=0.1)
    plain = LockClient.from_url(acknowledging.url, prefix=prefix)
    holds = {kind: make(client) for kind, (make, _) in KINDS.items()}
    upgradable = client.rwlock("upgraded").upgradable(ttl=30)
    ranged = client.range_lock("shrunk").read(0, 10, ttl=30)
    # Two holds of one dead task's, which its supervisor releases.
    orphans = [client.rwlock("orphaned").read(ttl=30, owner_info={"task_id": "t1"}) for _ in "ab"]
    for hold in (*holds.values(), upgradable, ranged, *orphans):
        assert hold.acquire()
    for orphan in orphans:
        heartbeat().remove(orphan)  # as if its process had died
    master = cut_replication(acknowledging)
    try:
        for kind, hold in holds.items():
            with pytest.raises(LockNotReplicated, match="was released on the master"):
                hold.release()
            assert not hold.held, kind
            with pytest.raises(LockNotHeld):
                hold.release()
            assert takes(KINDS[kind][1](plain)), kind

        with pytest.raises(LockNotReplicated, match="was upgraded on the master"):
            upgradable.upgrade()
        assert upgradable.upgraded and upgradable.held
        assert not plain.rwlock("upgraded").read(ttl=5).acquire()  # the writer is in
        with pytest.raises(LockNotReplicated, match="was downgraded on the master"):
            upgradable.downgrade()
        assert not upgradable.upgraded and upgradable.held
        assert takes(plain.rwlock("upgraded").read(ttl=5))

        with pytest.raises(LockNotReplicated, match="was upgraded on the master"):
            upgradable.upgrade()
        with pytest.raises(LockNotReplicated, match="was released on the master"):
            upgradable.release()
        assert not upgradable.upgraded and not upgradable.held

        with pytest.raises(LockNotReplicated, match="was released on the master"):
            orphans[0].release_holder(task_id="t1", pid=os.getpid())
        assert takes(plain.rwlock("orphaned").write(ttl=5))  # both of its holds went

        with pytest.raises(LockNotReplicated, match="was shrunk on the master"):
            ranged.shrink(0, 5)
        assert (ranged.lo, ranged.hi) == (0, 5) and ranged.held
        assert takes(plain.range_lock("shrunk").write(6, 10, ttl=5))
        assert not plain.range_lock("shrunk").write(5, 10, ttl=5).acquire()

        with pytest.raises(LockNotReplicated):
            ranged.release()
    finally:
        master.close()
        client.close()
        plain.close()


@pytest.mark.parametrize(
    ("replicas", "replica_timeout", "argument"),
    [(-1, 1.0, "replicas"), (True, 1.0, "replicas"), (1, 0, "replica_timeout")],
)
def test_the_asyncio_client_refuses_bad_replication_arguments(
    replicas: object, replica_timeout: object, argument: str
) -> None:
    # Nothing listens on port 1, and nothing is awaited: refused before any Redis call.
    with pytest.raises(ConfigurationError) as refused:
        AsyncLockClient.from_url(
            "redis://127.0.0.1:1/0",
            replicas=replicas,  # type: ignore[arg-type]
            replica_timeout=replica_timeout,  # type: ignore[arg-type]
        )
    assert refused.value.argument == argument
    with pytest.raises(ConfigurationError) as refused:
        AsyncLockClient(
            redis.asyncio.Redis(port=1),
            replicas=replicas,  # type: ignore[arg-type]
            replica_timeout=replica_timeout,  # type: ignore[arg-type]
        )
    assert refused.value.argument == argument


def test_the_asyncio_client_waits_for_its_replicas(acknowledging: SentinelSet, prefix: str) -> None:
    """``AsyncLockClient(replicas=1)``, a lease and a reader-writer write hold: with the
    replica paused an acquire is undone and raised (another client takes the lock at once);
    with replication cut a release happened on the master, then raises."""
    plain = LockClient.from_url(acknowledging.url, prefix=prefix)
    rivals = {"lease": plain.lease("async-lease", ttl=5), "write": plain.rwlock("async-rw").read()}

    def holds(client: AsyncLockClient) -> dict[str, Any]:
        return {
            "lease": client.lease("async-lease", ttl=30),
            "write": client.rwlock("async-rw").write(ttl=30),
        }

    async def acquires_undone(client: AsyncLockClient) -> None:
        with replica_paused(acknowledging):
            for kind, hold in holds(client).items():
                with pytest.raises(LockNotReplicated, match=r"not replicated to 1 replica\(s\)"):
                    await hold.acquire()
                assert not hold.held, kind
                assert takes(rivals[kind]), kind

    async def releases_on_the_master(client: AsyncLockClient) -> None:
        held = holds(client)
        for hold in held.values():
            assert await hold.acquire()
        master = cut_replication(acknowledging)
        try:
            for kind, hold in held.items():
                with pytest.raises(LockNotReplicated, match="was released on the master"):
                    await hold.release()
                assert not hold.held, kind
                with pytest.raises(LockNotHeld):
                    await hold.release()
                assert takes(rivals[kind]), kind
        finally:
            master.close()

    async def main() -> None:
        client = AsyncLockClient.from_url(
            acknowledging.url, prefix=prefix, replicas=1, replica_timeout=0.1
        )
        try:
            await acquires_undone(client)
            await releases_on_the_master(client)
        finally:
            await client.close()

    try:
        asyncio.run(main())
    finally:
        plain.close()


def test_holds_acknowledged_by_the_replica_survive_a_failover(
    acknowledging: SentinelSet, prefix: str
) -> None:
    """A reader-writer write hold (sync) and an asyncio lease, each taken with
    ``replicas=1`` while the replica is stopped: neither acquire returns before the replica
    is resumed and has it. The master is killed right after they returned; on the promoted
    replica a second client takes neither."""
    first = LockClient.from_url(acknowledging.url, prefix=prefix, replicas=1, replica_timeout=5)
    second = LockClient.from_url(acknowledging.url, prefix=prefix)
    write = first.rwlock("failover-rw").write(ttl=30)

    async def async_lease() -> str | None:
        client = AsyncLockClient.from_url(
            acknowledging.url, prefix=prefix, replicas=1, replica_timeout=5
        )
        try:
            # No heartbeat: its event loop ends here; the ttl outlasts the failover.
            lease = client.lease("failover-lease", ttl=60, heartbeat=False)
            assert await lease.acquire()
            return lease.owner
        finally:
            await client.close()

    replica = acknowledging.replica.process
    assert replica is not None
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            acquired = pool.submit(write.acquire)
            leased = pool.submit(asyncio.run, async_lease())
            # Both scripts ran; the master now blocks both calls in WAIT for the replica.
            wait_until(
                lambda: blocked_clients(acknowledging.master.port) == 2, 10, "the acquires' WAIT"
            )
            assert not acquired.done() and not leased.done()
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        assert acquired.result(timeout=20) is True
        lease_owner = leased.result(timeout=20)
        port = fail_over(acknowledging)  # kills the master right after the acquires returned

        def second_answers() -> bool:
            try:
                return second.rwlock("failover-rw").read(ttl=5).acquire() is False
            except LockBackendError:
                return False  # still finding the new master

        wait_until(second_answers, FAILOVER_TIMEOUT, "the second client on the new master")
        assert not second.lease("failover-lease", ttl=5).acquire()
        assert [holder.owner for holder in second.lease("failover-lease").holders()] == [
            lease_owner
        ]
        promoted = SentinelSet.node(port)
        try:
            assert promoted.info("replication")["role"] == "master"
        finally:
            promoted.close()
    finally:
        heartbeat().remove(write)  # its servers go with the fixture: renew it no more
        pool.shutdown(wait=False)
        first.close()
        second.close()
