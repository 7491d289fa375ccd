"""Sharded pub/sub on a real 3-master Redis Cluster: a release is published with SPUBLISH and
reaches only the node owning the lock's slot, where its waiters SSUBSCRIBE through one
connection per node (sync and asyncio); a node's listener that dies is replaced (sync and
asyncio), a channel whose slot migrates follows it, and a cluster without SPUBLISH falls back
to PUBLISH, whose release every node sees."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from support.redis_topologies import Cluster, running, wait_until
from support.slot_migration import SlotMigration
from test_cluster import evalsha_calls, names_on_every_node, node_port, shard_subscribers

from celery_singleton_lock import AsyncLockClient, LockClient

WAIT = 20.0


def channel_of(client: LockClient, name: str) -> bytes:
    return client.connection.keys(name).channel


def marked(client: LockClient, name: str) -> bool:
    """Whether a waiter marked the held lease (its release then publishes)."""
    return bool(client.redis.hget(client.connection.keys(name).lock, "waiting"))


def shard_counts(cluster: Cluster, channel: bytes) -> dict[int, int]:
    """Port -> the SSUBSCRIBE subscribers each master counts on ``channel``."""
    counts = {}
    for port in cluster.ports:
        node = cluster.node(port)
        counts[port] = shard_subscribers(node, channel)
        node.close()
    return counts


def pubsub_clients(cluster: Cluster) -> dict[int, int]:
    """Port -> the pub/sub connections each master has."""
    counts = {}
    for port in cluster.ports:
        node = cluster.node(port)
        counts[port] = len(node.client_list(_type="pubsub"))
        node.close()
    return counts


class Waiter:
    """``lease.acquire(wait=WAIT)`` in a thread."""

    def __init__(self, lease: Any) -> None:
        self.lease = lease
        self.got: list[bool] = []
        self.thread = threading.Thread(target=lambda: self.got.append(lease.acquire(wait=WAIT)))
        self.thread.start()

    def result(self) -> list[bool]:
        self.thread.join(WAIT)
        return self.got


class Probes:
    """A plain SUBSCRIBE to one channel on every master: what a PUBLISH would reach."""

    def __init__(self, cluster: Cluster, channel: bytes) -> None:
        self.channel = channel
        self.subs: dict[int, Any] = {}
        for port in cluster.ports:
            sub = cluster.node(port).pubsub()
            sub.subscribe(channel)
            reply = sub.get_message(timeout=5)
            assert reply is not None and reply["type"] == "subscribe"
            self.subs[port] = sub

    def seen_before_marker(self, owner: redis.Redis) -> dict[int, list[bytes]]:
        """Publish a marker on the channel from ``owner``, then the messages each probe
        read before it: the cluster bus delivers in order, so anything a release sent to
        another node arrives there before the marker."""
        owner.publish(self.channel, b"marker")
        seen: dict[int, list[bytes]] = {}
        for port, sub in self.subs.items():
            got: list[bytes] = []
            deadline = time.monotonic() + 5
            while True:
                assert time.monotonic() < deadline, f"no marker on {port}"
                message = sub.get_message(timeout=1)
                if message is None or message["type"] != "message":
                    continue
                if message["data"] == b"marker":
                    break
                got.append(message["data"])
            seen[port] = got
        return seen

    def close(self) -> None:
        for sub in self.subs.values():
            sub.close()


def test_waiters_on_every_master_shard_subscribe_and_releases_stay_on_their_node(
    cluster: Cluster, client: LockClient
) -> None:
    names = names_on_every_node(client, per_node=2, stem="shard")
    holders = [client.lease(name, ttl=30) for name in names]
    assert all(holder.acquire() for holder in holders)
    waiters = [Waiter(client.lease(name, ttl=30)) for name in names]
    for name in names:
        owner = node_port(client, client.connection.keys(name).lock)
        expected = {port: int(port == owner) for port in cluster.ports}
        wait_until(
            lambda n=name, e=expected: shard_counts(cluster, channel_of(client, n)) == e,
            5,
            f"{name} SSUBSCRIBEd on its slot's node only",
        )
        wait_until(lambda n=name: marked(client, n), 5, f"{name}'s waiter to mark the lease")
    # Two channels on each master, one pub/sub connection to each.
    assert pubsub_clients(cluster) == dict.fromkeys(cluster.ports, 1)
    for name, holder, waiter in zip(names, holders, waiters, strict=True):
        owner_port = node_port(client, client.connection.keys(name).lock)
        probes = Probes(cluster, channel_of(client, name))
        try:
            started = time.monotonic()
            holder.release()
            assert waiter.result() == [True], name
            assert time.monotonic() - started < 2.0, "woken by the release, not its 30 s hint"
            owner = cluster.node(owner_port)
            # A PUBLISH would have reached every probe; an SPUBLISH reaches none of them.
            assert probes.seen_before_marker(owner) == dict.fromkeys(cluster.ports, [])
            owner.close()
        finally:
            probes.close()
        waiter.lease.release()
    # A channel left by its last waiter is forgotten (no map growing with every name).
    assert client.connection.notifier.placement.placed() == []  # type: ignore[union-attr]


def test_a_killed_listener_is_replaced_and_its_waiters_look_again(
    cluster: Cluster, client: LockClient
) -> None:
    name = names_on_every_node(client, stem="kill")[0]
    channel = channel_of(client, name)
    port = node_port(client, client.connection.keys(name).lock)
    holder = client.lease(name, ttl=30)
    assert holder.acquire()
    waiter = Waiter(client.lease(name, ttl=30))
    wait_until(lambda: shard_counts(cluster, channel)[port] == 1, 5, "the SSUBSCRIBE")
    wait_until(lambda: marked(client, name), 5, "the waiter's mark")
    attempts = evalsha_calls(cluster)[port]
    node = cluster.node(port)
    assert node.client_kill_filter(_type="pubsub") == 1
    node.close()
    # The waiter tries again at once (a release may have gone unheard), not at its hint.
    wait_until(lambda: evalsha_calls(cluster)[port] > attempts, 5, "the waiter to look again")
    wait_until(lambda: shard_counts(cluster, channel)[port] == 1, 5, "a new SSUBSCRIBE")
    started = time.monotonic()
    holder.release()
    assert waiter.result() == [True]
    assert time.monotonic() - started < 2.0, "woken by the release on the new connection"
    waiter.lease.release()


def migrate_slot(cluster: Cluster, slot: int, target: int) -> None:
    """Move ``slot`` with its keys to master port ``target``, as a reshard does."""
    migration = SlotMigration(cluster, slot, target)
    try:
        migration.run()
    finally:
        migration.close()


def test_a_channel_follows_its_slot_to_another_node(cluster: Cluster, client: LockClient) -> None:
    name = names_on_every_node(client, stem="move")[0]
    channel = channel_of(client, name)
    lock_key = client.connection.keys(name).lock
    source = node_port(client, lock_key)
    target = next(port for port in cluster.ports if port != source)
    slot = client.redis.keyslot(lock_key)
    holder = client.lease(name, ttl=30)
    assert holder.acquire()
    waiter = Waiter(client.lease(name, ttl=30))
    wait_until(lambda: shard_counts(cluster, channel)[source] == 1, 5, "the SSUBSCRIBE")
    wait_until(lambda: marked(client, name), 5, "the waiter's mark")
    try:
        migrate_slot(cluster, slot, target)
        # The source node drops the channel's subscription; the listener subscribes it on
        # the target, where the release will be published.
        expected = {port: int(port == target) for port in cluster.ports}
        wait_until(lambda: shard_counts(cluster, channel) == expected, 10, "the move")
        wait_until(lambda: marked(client, name), 5, "the waiter's mark on the target")
        started = time.monotonic()
        holder.release()
        assert waiter.result() == [True]
        assert time.monotonic() - started < 2.0, "woken by the release on the target node"
        waiter.lease.release()
    finally:
        migrate_slot(cluster, slot, source)
        client.redis.exists(lock_key)  # the client follows the MOVED back


def test_async_waiters_on_every_master_shard_subscribe(
    cluster: Cluster, client: LockClient
) -> None:
    names = names_on_every_node(client, stem="async")

    async def body() -> None:
        aio = AsyncLockClient.from_url(cluster.url, prefix=client.prefix)
        try:
            holders = [aio.lease(name, ttl=30) for name in names]
            for holder in holders:
                assert await holder.acquire()
            waiting = [
                asyncio.ensure_future(aio.lease(name, ttl=30).acquire(wait=WAIT)) for name in names
            ]
            for name in names:
                owner = node_port(client, client.connection.keys(name).lock)
                expected = {port: int(port == owner) for port in cluster.ports}
                await eventually(
                    lambda n=name, e=expected: shard_counts(cluster, channel_of(client, n)) == e,
                    f"{name} SSUBSCRIBEd on its slot's node only",
                )
                await eventually(lambda n=name: marked(client, n), f"{name}'s mark")
            assert pubsub_clients(cluster) == dict.fromkeys(cluster.ports, 1)
            for holder, task in zip(holders, waiting, strict=True):
                started = time.monotonic()
                await holder.release()
                assert await asyncio.wait_for(task, WAIT) is True
                assert time.monotonic() - started < 2.0
        finally:
            await aio.close()

    asyncio.run(body())


def test_an_async_listener_killed_is_replaced_and_its_waiter_looks_again(
    cluster: Cluster, client: LockClient
) -> None:
    name = names_on_every_node(client, stem="akill")[1]
    channel = channel_of(client, name)
    port = node_port(client, client.connection.keys(name).lock)

    async def body() -> None:
        aio = AsyncLockClient.from_url(cluster.url, prefix=client.prefix)
        try:
            holder = aio.lease(name, ttl=30)
            assert await holder.acquire()
            waiting = asyncio.ensure_future(aio.lease(name, ttl=30).acquire(wait=WAIT))
            await eventually(lambda: shard_counts(cluster, channel)[port] == 1, "SSUBSCRIBE")
            await eventually(lambda: marked(client, name), "the waiter's mark")
            attempts = evalsha_calls(cluster)[port]
            node = cluster.node(port)
            assert node.client_kill_filter(_type="pubsub") == 1
            node.close()
            await eventually(lambda: evalsha_calls(cluster)[port] > attempts, "a new look")
            await eventually(lambda: shard_counts(cluster, channel)[port] == 1, "resubscribe")
            started = time.monotonic()
            await holder.release()
            assert await asyncio.wait_for(waiting, WAIT) is True
            assert time.monotonic() - started < 2.0, "woken on the new connection"
        finally:
            await aio.close()

    asyncio.run(body())


async def eventually(probe: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


class ClusterWithoutSpublish(Cluster):
    """Masters that answer as a server older than Redis 7 would: no SPUBLISH."""

    @staticmethod
    def _server(bus_port: int, extra: list[str]) -> Any:
        renamed = ["--rename-command", "SPUBLISH", "SPUBLISH_DISABLED"]
        return Cluster._server(bus_port, [*extra, *renamed])


def test_without_spublish_waiters_subscribe_and_releases_publish() -> None:
    with running(ClusterWithoutSpublish(3)) as cluster:
        client = LockClient.from_url(cluster.url, prefix="csltest:nospublish:")
        try:
            for name in names_on_every_node(client, stem="old"):
                channel = channel_of(client, name)
                holder = client.lease(name, ttl=30)
                assert holder.acquire()
                waiter = Waiter(client.lease(name, ttl=30))
                owner = node_port(client, client.connection.keys(name).lock)
                node = cluster.node(owner)
                wait_until(lambda n=node, c=channel: n.pubsub_numsub(c)[0][1] == 1, 5, "SUBSCRIBE")
                assert shard_counts(cluster, channel) == dict.fromkeys(cluster.ports, 0)
                node.close()
                wait_until(lambda n=name: marked(client, n), 5, "the waiter's mark")
                probes = Probes(cluster, channel)
                try:
                    started = time.monotonic()
                    holder.release()
                    assert waiter.result() == [True], name
                    assert time.monotonic() - started < 2.0, "woken by the PUBLISH"
                    # A PUBLISH crosses the bus to every node.
                    owner_node = cluster.node(owner)
                    seen = probes.seen_before_marker(owner_node)
                    owner_node.close()
                    assert seen == dict.fromkeys(cluster.ports, [b"released"])
                finally:
                    probes.close()
                waiter.lease.release()
        finally:
            client.close()
