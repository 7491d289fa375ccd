"""The asyncio client on a real 3-master Redis Cluster, made from a ``redis+cluster://`` URL
as the sync client is: leases on every master, renewed past their ttl; a waiter woken by a
release through its node's pub/sub; one lock with the sync client; the admin view over every
node."""

from __future__ import annotations

import asyncio
import time

from redis.asyncio.cluster import RedisCluster
from support.redis_topologies import Cluster
from test_cluster import names_on_every_node

from celery_singleton_lock import AsyncLockClient, LockClient

TIMEOUT = 20.0


def waiters_marked(sync: LockClient, name: str) -> bool:
    """Whether a waiter has marked the held lease (its release then publishes): a waiter
    marks it in the attempt it makes once subscribed."""
    return bool(sync.redis.hget(sync.connection.keys(name).lock, "waiting"))


async def eventually(probe: object, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not probe():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_leases_on_every_master_renew_wake_and_list(cluster: Cluster, prefix: str) -> None:
    sync = LockClient.from_url(cluster.url, prefix=prefix)
    names = names_on_every_node(sync)

    async def body() -> None:
        client = AsyncLockClient.from_url(cluster.url, prefix=prefix)
        try:
            assert isinstance(client.redis, RedisCluster)
            hosts = ",".join(sorted(f"127.0.0.1:{port}" for port in cluster.ports))
            assert client.url == f"redis+cluster://{hosts}"
            leases = [client.lease(name, ttl=1) for name in names]
            for lease in leases:
                assert await lease.acquire()
            # One lock with the sync client, on every master.
            assert not any(sync.lease(name).acquire() for name in names)
            # Renewed past their 1 s ttl by the heartbeat of this loop.
            await asyncio.sleep(2.5)
            for lease in leases:
                lease.check()
            listed = {info.name: info.state for info in await client.locks()}
            assert listed == {name: "live" for name in names}
            for lease in leases:
                await lease.release()
            # A waiter on each master is woken by the release there (published on, and
            # subscribed to at, the node owning the lock's slot), long before a 30 s lease's
            # end.
            for name in names:
                holder = client.lease(name, ttl=30)
                assert await holder.acquire()
                waiter = client.lease(name, ttl=30)
                waiting = asyncio.ensure_future(waiter.acquire(wait=TIMEOUT))
                await eventually(lambda n=name: waiters_marked(sync, n), "the waiter's mark")
                released = time.monotonic()
                await holder.release()
                assert await asyncio.wait_for(waiting, TIMEOUT) is True
                assert time.monotonic() - released < 5.0
                assert await client.clear(name, force=True)
            assert await client.locks() == []
        finally:
            await client.close()

    try:
        asyncio.run(body())
    finally:
        sync.close()
