"""Replicated locks (``replicas=N``): a lease's writes are acknowledged by N replicas (WAIT,
in the same round trip) before the call reports success. On a master, a replica and a
sentinel: an acquire that returned survives a failover; one the replica cannot have is
undone and raised; a release or renewal the replica did not acknowledge is reported."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from celery import Celery
from support.redis_topologies import Cluster, SentinelSet, running, wait_until
from test_cluster_failover import PROMOTION_TIMEOUT, names_on
from test_cluster_failover import fail_over as fail_over_cluster
from test_sentinel import FAILOVER_TIMEOUT, fail_over

from celery_singleton_lock import (
    AsyncLockClient,
    ConfigurationError,
    LockBackendError,
    LockClient,
    LockExpired,
    LockNotHeld,
    LockNotReplicated,
)
from celery_singleton_lock.celery.app_client import close_lock_client, lock_client_for
from celery_singleton_lock.celery.options import AppSettings
from celery_singleton_lock.core.heartbeat import heartbeat, renew_calls
from celery_singleton_lock.core.replication import Replication
from celery_singleton_lock.core.scripts import run_batch
from celery_singleton_lock.kinds.lease import Lease


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    with running(SentinelSet()) as topology:
        master = SentinelSet.node(topology.master.port)
        try:
            # A replica that just synced gets the master's writes only after its first
            # REPLCONF ACK (sent once a second): until then no WAIT can be met.
            wait_until(lambda: acknowledged_write(master), 10, "the replica to acknowledge")
        finally:
            master.close()
        yield topology


@pytest.fixture
def heartbeat_log() -> Iterator[list[logging.LogRecord]]:
    """What the heartbeat logs during the test, read from its own logger (another test in
    the same process may have reconfigured logging, e.g. a Celery worker's set-up)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("celery_singleton_lock.heartbeat")
    was_disabled, logger.disabled = logger.disabled, False
    was_level = logger.level
    logger.setLevel(logging.WARNING)  # whatever level the root logger was left at
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(was_level)
        logger.disabled = was_disabled


def acknowledged_write(master: redis.Redis) -> bool:
    pipe = master.pipeline(transaction=False)
    pipe.set("csltest:replication-probe", 1)
    pipe.execute_command("WAIT", 1, 100)
    return bool(pipe.execute()[1] == 1)


@pytest.mark.parametrize(
    ("replicas", "replica_timeout", "argument"),
    [
        (-1, 1.0, "replicas"),
        (1.0, 1.0, "replicas"),
        (True, 1.0, "replicas"),
        ("1", 1.0, "replicas"),
        (1, 0, "replica_timeout"),
        (1, -1.0, "replica_timeout"),
        (1, float("nan"), "replica_timeout"),
        (1, "1", "replica_timeout"),
    ],
)
def test_bad_replication_arguments_are_refused_before_any_redis_call(
    replicas: object, replica_timeout: object, argument: str
) -> None:
    # Nothing listens on port 1: a client that tried to talk to Redis would fail otherwise.
    with pytest.raises(ConfigurationError) as refused:
        LockClient.from_url(
            "redis://127.0.0.1:1/0",
            replicas=replicas,  # type: ignore[arg-type]
            replica_timeout=replica_timeout,  # type: ignore[arg-type]
        )
    assert refused.value.argument == argument
    unused = redis.Redis(port=1)
    with pytest.raises(ConfigurationError) as refused:
        LockClient(
            unused,
            replicas=replicas,  # type: ignore[arg-type]
            replica_timeout=replica_timeout,  # type: ignore[arg-type]
        )
    assert refused.value.argument == argument
    unused.close()


def blocked_clients(port: int) -> int:
    node = SentinelSet.node(port)
    try:
        return int(node.info("clients")["blocked_clients"])
    finally:
        node.close()


def test_a_replicated_acquire_waits_for_the_replica_and_survives_a_failover(
    sentinels: SentinelSet, prefix: str
) -> None:
    """The replica is stopped (SIGSTOP) while the lease is acquired: the acquire does not
    return until the replica has it. The master is killed right after the acquire returned;
    on the promoted replica a second client cannot take the name, and the first still
    holds and renews it there."""
    first = LockClient.from_url(sentinels.url, prefix=prefix, replicas=1, replica_timeout=20)
    second = LockClient.from_url(sentinels.url, prefix=prefix)
    replica = sentinels.replica.process
    assert replica is not None
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        lease = first.lease("report", ttl=30)
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            acquired = pool.submit(lease.acquire)
            # The script ran; the master now blocks the call in WAIT for the replica.
            wait_until(
                lambda: blocked_clients(sentinels.master.port) == 1, 10, "the acquire's WAIT"
            )
            assert not acquired.done()
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        assert acquired.result(timeout=20) is True
        sentinels.master.kill()  # right after the acquire returned
        port = fail_over(sentinels)
        promoted = SentinelSet.node(port)
        try:
            assert promoted.exists(first.connection.keys("report").lock) == 1
        finally:
            promoted.close()

        def second_answers() -> bool:
            try:
                return second.lease("report", ttl=5).acquire() is False
            except LockBackendError:
                return False  # still finding the new master

        wait_until(second_answers, FAILOVER_TIMEOUT, "the second client on the new master")
        assert [holder.owner for holder in second.lease("report").holders()] == [lease.owner]
        assert lease.held
    finally:
        heartbeat().remove(lease)  # its servers go with the fixture: renew it no more
        pool.shutdown(wait=False)
        first.close()
        second.close()


def cut_replication(sentinels: SentinelSet) -> redis.Redis:
    """The replica may no longer sync from the master (ACL) and its link is dropped: from
    now on nothing the master writes reaches it. Returns a connection to the master."""
    master = SentinelSet.node(sentinels.master.port)
    replica = SentinelSet.node(sentinels.replica.port)
    try:
        master.execute_command("ACL", "SETUSER", "default", "-psync", "-sync", "-replconf")
        master.execute_command("CLIENT", "KILL", "TYPE", "replica")
        wait_until(
            lambda: replica.info("replication").get("master_link_status") == "down",
            10,
            "the replica's link to go down",
        )
    finally:
        replica.close()
    return master


def test_an_acquire_the_replica_cannot_have_is_undone_and_raised(
    sentinels: SentinelSet, prefix: str
) -> None:
    client = LockClient.from_url(sentinels.url, prefix=prefix, replicas=1, replica_timeout=0.2)
    master = cut_replication(sentinels)
    try:
        lease = client.lease("report", ttl=30)
        with pytest.raises(LockNotReplicated) as refused:
            lease.acquire()
        assert "not replicated to 1 replica(s) within 200 ms (0 acknowledged)" in str(refused.value)
        assert isinstance(refused.value, LockBackendError)
        assert not lease.held
        # Nothing half-held on the master: the acquire was undone there.
        assert master.exists(client.connection.keys("report").lock) == 0
        unreplicated = LockClient.from_url(sentinels.url, prefix=prefix)
        try:
            with unreplicated.lease("report", ttl=5) as taken:
                assert taken.held
        finally:
            unreplicated.close()
    finally:
        master.close()
        client.close()


def test_a_release_and_renewals_the_replica_did_not_acknowledge(
    sentinels: SentinelSet, prefix: str, heartbeat_log: list[logging.LogRecord]
) -> None:
    """Taken while replicated, then replication is cut: a renewal is a failed renewal (the
    lease is lost once it could have run out), and a release raises LockNotReplicated after
    it happened on the master."""
    client = LockClient.from_url(sentinels.url, prefix=prefix, replicas=1, replica_timeout=0.1)
    lost = threading.Event()
    try:
        renewed = client.lease("renewed", ttl=1.5, on_lost=lambda _: lost.set())
        released = client.lease("released", ttl=30)
        handed = client.lease("handed", ttl=30)
        assert renewed.acquire() and released.acquire() and handed.acquire()
        master = cut_replication(sentinels)
        try:
            with pytest.raises(LockNotReplicated):
                renewed.extend()
            # The heartbeat's renewals are not acknowledged either: lost once it could
            # have run out, as when Redis does not answer.
            assert lost.wait(10)
            assert renewed.lost
            # Said as what it is: Redis answered, its replica did not acknowledge.
            said = [record.getMessage() for record in heartbeat_log]
            assert any("renewals were not acknowledged by the replicas" in m for m in said)
            # (Only this client's: the process's heartbeat also renews what earlier tests
            # left held on servers since stopped.)
            assert not any("could not reach Redis" in m and client.url in m for m in said)
            with pytest.raises(LockExpired) as expired:
                renewed.check()
            assert expired.value.reason == "unreachable"
            with pytest.raises(LockNotReplicated) as refused:
                released.release()
            assert "was released on the master" in str(refused.value)
            assert master.exists(client.connection.keys("released").lock) == 0
            assert not released.held
            with pytest.raises(LockNotHeld):
                released.release()
            with pytest.raises(LockNotReplicated) as refused:
                handed.hand_over("claim:next-run", ttl=30)
            assert "was handed over on the master" in str(refused.value)
            assert not handed.held
            claim = client.lease("handed").holders()
            assert [holder.owner for holder in claim] == ["claim:next-run"]
        finally:
            master.close()
    finally:
        client.close()


def test_the_celery_app_client_reads_the_replication_settings(
    sentinels: SentinelSet, prefix: str
) -> None:
    app = Celery(
        "replicated",
        set_as_current=False,
        config_source={
            "singleton_lock_url": sentinels.url,
            "singleton_lock_prefix": prefix,
            "singleton_lock_replicas": 1,
            "singleton_lock_replica_timeout": 2.5,
        },
    )
    try:
        client = lock_client_for(app)
        assert client.connection.replication == Replication(1, 2500)
        with client.lease("nightly", ttl=5) as lease:
            replica = SentinelSet.node(sentinels.replica.port)
            try:  # acknowledged: the replica has it by the time the acquire returned
                assert replica.exists(lease.keys.lock) == 1
            finally:
                replica.close()
    finally:
        close_lock_client(app)
    unset = Celery("plain", set_as_current=False, config_source={"singleton_lock_url": "redis://x"})
    assert AppSettings.from_conf(unset.conf).replicas == 0
    with pytest.raises(ConfigurationError) as refused:
        AppSettings.from_conf(
            Celery(
                "bad",
                set_as_current=False,
                config_source={"singleton_lock_url": "redis://x", "singleton_lock_replicas": "2"},
            ).conf
        )
    assert refused.value.argument == "singleton_lock_replicas"


@pytest.mark.timeout(150)
def test_on_a_cluster_each_node_waits_for_its_replica_and_a_failover_keeps_the_lock() -> None:
    """Three masters with a replica each: a lease on each master, renewed in one batch (a
    WAIT sent to each node after its calls); master 0 is killed right after its acquire
    returned, and on its promoted replica the name is still held."""
    with running(Cluster(3, replicas=1)) as cluster:
        prefix = f"csltest:{uuid.uuid4().hex[:12]}:"
        first = LockClient.from_url(
            cluster.url_with_all_nodes, prefix=prefix, replicas=1, replica_timeout=2
        )
        second = LockClient.from_url(cluster.url_with_all_nodes, prefix=prefix)
        try:
            names = [names_on(first, cluster, index, f"n{index}-")[0] for index in (2, 1, 0)]

            def acquired(name: str) -> Lease | None:
                # No heartbeat: the batch below renews them, and the process's heartbeat
                # must not go on renewing them after this cluster is gone.
                lease = first.lease(name, ttl=60, heartbeat=False)
                try:
                    return lease if lease.acquire() else None
                except LockNotReplicated:
                    return None  # a replica that just synced: its first ACK is still due

            leases = [
                wait_until(lambda name=name: acquired(name), 10, f"{name!r} replicated")
                for name in names
            ]
            conn = first.connection
            entries = [(lease, lease.owner, 60_000, 0) for lease in leases]  # ttl, no extend yet
            calls, decode = renew_calls(conn, entries)
            codes = decode(conn.call(run_batch, conn.redis, calls, conn.replication))
            assert len(codes) == 3 and all(code > 0 for code in codes)  # ms granted each
            # A multi-key lock on a Cluster takes and releases its names as leases, one
            # slot at a time, each waiting for its node's replica.
            both = first.multi([names_on(first, cluster, i, f"m{i}-")[0] for i in (1, 2)])
            assert both.acquire()
            both.release()
            # The asyncio client: a WAIT to each node, after that node's calls.
            on_each = [names_on(first, cluster, index, f"a{index}-")[0] for index in (0, 1, 2)]
            assert asyncio.run(async_leases_on_each_node(cluster, prefix, on_each)) == 3
            fail_over_cluster(cluster, 0)  # master 0's lease (the last acquired) was replicated

            def second_answers() -> bool:
                try:
                    return second.lease(names[2], ttl=5).acquire() is False
                except LockBackendError:
                    return False  # still finding the new slot map

            wait_until(second_answers, PROMOTION_TIMEOUT, "the second client after failover")
            holders = second.lease(names[2]).holders()
            assert [holder.owner for holder in holders] == [leases[2].owner]
        finally:
            first.close()
            second.close()


async def async_leases_on_each_node(cluster: Cluster, prefix: str, names: list[str]) -> int:
    """With an asyncio ``replicas=1`` client on ``cluster``: leases on ``names`` (one on each
    master) acquired, renewed in one batch and released, each acknowledged by its node's
    replica; then, with master 1's replica stopped, only the lease on master 1 is refused.
    How many renewals were granted."""
    client = AsyncLockClient.from_url(
        cluster.url_with_all_nodes, prefix=prefix, replicas=1, replica_timeout=0.5
    )
    try:
        leases = [client.lease(name, ttl=60, heartbeat=False) for name in names]
        for lease in leases:
            assert await lease.acquire()
        conn = client.connection
        entries = [(lease, lease.owner, 60_000, 0) for lease in leases]  # ttl, no extend yet
        calls, decode = renew_calls(conn, entries)  # type: ignore[arg-type]
        codes = decode(await conn.batch(calls))
        for lease in leases:
            await lease.release()
        (replica,) = cluster.replicas[1]
        assert replica.process is not None
        os.kill(replica.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(LockNotReplicated):
                await leases[1].acquire()
            assert await leases[2].acquire()  # its own node's replica acknowledges
            await leases[2].release()
        finally:
            os.kill(replica.process.pid, signal.SIGCONT)
        return sum(1 for code in codes if code > 0)
    finally:
        await client.close()
