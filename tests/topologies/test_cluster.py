"""Every primitive on a real Redis Cluster of three masters (started once for this module):
one lock's keys share a slot, the heartbeat renews in one round trip per node, waiters are
woken across nodes, multi-key locks span nodes, and the admin side scans every master."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner
from redis.cluster import RedisCluster
from support.redis_topologies import Cluster, wait_until

from celery_singleton_lock import LockClient, LockTaken
from celery_singleton_lock.celery.task import lock_client_for
from celery_singleton_lock.cli import commands
from celery_singleton_lock.core.heartbeat import heartbeat
from celery_singleton_lock.kinds.intervals import interval_keys
from celery_singleton_lock.kinds.rwlock import rw_keys


def node_port(client: LockClient, key: bytes) -> int:
    return int(client.redis.get_node_from_key(key).port)


def names_on_every_node(client: LockClient, per_node: int = 1, stem: str = "n") -> list[str]:
    """Lock names whose keys live on each of the three masters, ``per_node`` of each."""
    found: dict[int, list[str]] = {}
    i = 0
    while len(found) < 3 or min(len(v) for v in found.values()) < per_node:
        name = f"{stem}{i}"
        i += 1
        bucket = found.setdefault(node_port(client, client.connection.keys(name).lock), [])
        if len(bucket) < per_node:
            bucket.append(name)
    return [name for names in found.values() for name in names]


def evalsha_calls(cluster: Cluster) -> dict[int, int]:
    """EVALSHA calls each master has served so far (INFO commandstats)."""
    counts = {}
    for port in cluster.ports:
        node = cluster.node(port)
        stats = node.info("commandstats")
        node.close()
        counts[port] = int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return counts


def test_client_forms_and_url(cluster: Cluster, client: LockClient) -> None:
    assert isinstance(client.redis, RedisCluster)
    hosts = ",".join(sorted(f"127.0.0.1:{port}" for port in cluster.ports))
    assert client.url == f"redis+cluster://{hosts}"
    assert client.ping() and client.server_time() > 1.7e9
    wrapped = LockClient(cluster.client(), prefix=client.prefix)  # a RedisCluster of your own
    try:
        with wrapped.lease("wrapped", ttl=5) as lease:
            assert not client.lease("wrapped").acquire()
            assert lease.held
    finally:
        wrapped.close()


def test_one_lock_one_slot(client: LockClient) -> None:
    for name in ("plain", "x" * 300, "{braced}", "#hash", "ünï"):
        keys = client.connection.keys(name)
        rw, rng = rw_keys(client.prefix, name), interval_keys(client.prefix, name, b"range")
        every = [keys.lock, keys.fence, keys.channel, rw.lock, rw.holder("o"), rw.queue]
        every += [rw.waiting, rw.fence, rw.channel]
        every += [*rng.all("o"), rng.channel]
        assert len({client.redis.keyslot(key) for key in every}) == 1, name
        with (
            client.lease(name, ttl=5),
            client.rwlock(name).read(ttl=5),
            client.range_lock(name).write(0, 1, ttl=5),
        ):
            pass


def test_lease_on_every_node_with_waiters_woken_across_nodes(client: LockClient) -> None:
    names = names_on_every_node(client)
    assert len({node_port(client, client.connection.keys(n).lock) for n in names}) == 3
    for name in names:
        holder = client.lease(name, ttl=10)
        assert holder.acquire()
        assert not client.lease(name).acquire()
        waiter = client.lease(name, ttl=10)
        got: list[bool] = []
        thread = threading.Thread(target=lambda w=waiter, g=got: g.append(w.acquire(wait=20)))
        thread.start()
        # Subscribed once some node counts the waiter on this channel.
        wait_until(
            lambda n=name: subscribed(client, client.connection.keys(n).channel), 5, "subscribe"
        )
        started = time.monotonic()
        holder.release()
        thread.join(20)
        assert got == [True], name
        assert time.monotonic() - started < 2.0, "woken by the release, not its 10 s hint"
        assert waiter.token is not None and holder.token is not None
        assert waiter.token > holder.token
        waiter.release()


def test_fair_lease_is_handed_over_on_every_node(client: LockClient) -> None:
    for name in names_on_every_node(client, stem="fair"):
        holder = client.lease(name, ttl=10)
        assert holder.acquire()
        waiter = client.lease(name, ttl=10, fair=True)
        got: list[bool] = []
        thread = threading.Thread(target=lambda w=waiter, g=got: g.append(w.acquire(wait=20)))
        thread.start()
        queue = client.connection.keys(name).base + b"queue"
        wait_until(lambda q=queue: client.redis.llen(q) == 1, 5, "the waiter to queue")
        started = time.monotonic()
        holder.release()
        thread.join(20)
        assert got == [True], name
        assert time.monotonic() - started < 2.0, "handed the lease, not found at its hint"
        owner = client.redis.hget(client.connection.keys(name).lock, "owner")
        assert owner == waiter.owner.encode()  # type: ignore[union-attr]
        assert waiter.token is not None and holder.token is not None
        assert waiter.token > holder.token
        waiter.release()


def subscribed(client: LockClient, channel: bytes) -> bool:
    """True once any master counts a subscriber on ``channel`` (SSUBSCRIBE or SUBSCRIBE)."""
    for node in client.redis.get_primaries():
        connection = client.redis.get_redis_connection(node)
        if shard_subscribers(connection, channel) or connection.pubsub_numsub(channel)[0][1]:
            return True
    return False


def shard_subscribers(node: redis.Redis, channel: bytes) -> int:
    """The SSUBSCRIBE subscribers ``node`` counts on ``channel``."""
    return int(node.pubsub_shardnumsub(channel)[0][1])


def test_rwlock_and_range_lock(client: LockClient) -> None:
    for name in names_on_every_node(client, stem="rw"):
        rw = client.rwlock(name)
        with rw.read(ttl=5), rw.read(ttl=5):
            assert not rw.write(ttl=5).acquire()
        upgradable = rw.upgradable(ttl=5)
        with upgradable:
            assert upgradable.upgrade(wait=2)
            assert not rw.read(ttl=5).acquire()
            upgradable.downgrade()
            with rw.read(ttl=5):
                pass
        ranges = client.range_lock(name)
        with ranges.write(0, 10, ttl=5), ranges.read(11, 20, ttl=5):
            assert not ranges.read(5, 12, ttl=5).acquire()
            with ranges.write(21, 30, ttl=5) as beside:
                assert beside.held
        writer = ranges.write(0, 30, ttl=5)
        assert writer.acquire()
        writer.release()


def test_multi_spans_nodes_all_or_nothing(client: LockClient) -> None:
    names = names_on_every_node(client, stem="m")
    assert len({node_port(client, client.connection.keys(n).lock) for n in names}) == 3
    blocker = client.lease(names[-1], ttl=10)
    assert blocker.acquire()
    refused = client.multi(names, ttl=5)
    assert not refused.acquire()
    for name in names[:-1]:  # the names taken before the busy one were given back
        probe = client.lease(name, ttl=5)
        assert probe.acquire()
        probe.release()
    blocker.release()
    with client.multi(names, ttl=5) as held:
        assert set(held.tokens) == set(names) and held.token == max(held.tokens.values())
        for name in names:
            assert not client.lease(name).acquire()
        assert held.extend(8) == pytest.approx(8, abs=0.5)  # one name per slot, then combined
        assert {info.name for info in client.locks() if info.kind == "multi"} == set(names)
    for name in names:
        with client.lease(name, ttl=5):
            pass


def test_overlapping_multis_from_many_threads_never_deadlock(client: LockClient) -> None:
    names = names_on_every_node(client, per_node=2, stem="d")
    inside = 0
    most = 0
    guard = threading.Lock()
    failures: list[BaseException] = []

    def worker(picked: list[str]) -> None:
        nonlocal inside, most
        try:
            for _ in range(5):
                with client.multi(picked, ttl=5, wait=30):
                    with guard:
                        inside += 1
                        most = max(most, inside)
                    with guard:
                        inside -= 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    # Every pair of workers shares a name, taken in opposite orders of the lists.
    picks = [names[0:3], names[2:5][::-1], [names[4], names[5], names[0]], names[::-1]]
    threads = [threading.Thread(target=worker, args=(p,)) for p in picks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures and not any(t.is_alive() for t in threads)
    assert most == 1  # each pair overlaps: never two inside at once


def test_heartbeat_renews_in_one_round_trip_per_node(
    cluster: Cluster, client: LockClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = names_on_every_node(client, per_node=4, stem="hb")
    handles: list[Any] = [client.lease(name, ttl=1.2) for name in names]
    handles += [client.rwlock(name).read(ttl=1.2) for name in names[:6]]
    handles += [client.range_lock(name).write(0, 1, ttl=1.2) for name in names[6:]]
    handles.append(client.multi([f"hb-multi-{i}" for i in range(6)], ttl=1.2))
    for handle in handles:
        assert handle.acquire()
    # A spy on the socket writes of this thread: which node each one went to.
    writes: Counter[int] = Counter()
    me = threading.current_thread()
    send = redis.connection.Connection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        if threading.current_thread() is me and int(self.port) in cluster.ports:
            writes[int(self.port)] += 1
        send(self, command, check_health)

    heartbeat().tick()  # the first renewal loads the renew scripts on the nodes
    before = evalsha_calls(cluster)
    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counting)
    heartbeat().tick()
    monkeypatch.undo()
    after = evalsha_calls(cluster)
    assert set(writes) == set(cluster.ports) and set(writes.values()) == {1}, writes
    # One renew script per lock kind and slot (each lease name here has its own slot).
    slots = {client.redis.keyslot(client.connection.keys(n).lock) for n in names}
    assert sum(after[p] - before[p] for p in cluster.ports) >= len(slots)
    # Held well past their ttl by the background heartbeat, every kind, every node.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        time.sleep(0.1)  # the heartbeat runs meanwhile: no event marks "renewed"
        for handle in handles:
            handle.check()
    for handle in handles:
        assert handle.held
        handle.release()


def test_heartbeat_marks_a_multi_lost_when_one_name_is_taken(client: LockClient) -> None:
    names = names_on_every_node(client, stem="lost")
    lost = threading.Event()
    held = client.multi(names, ttl=0.9, on_lost=lambda _: lost.set())
    assert held.acquire()
    victim = client.connection.keys(names[1])
    client.redis.hset(victim.lock, "owner", "somebody-else")
    assert lost.wait(5)
    with pytest.raises(LockTaken):
        held.check()


def test_admin_lists_and_clears_on_every_master(cluster: Cluster, client: LockClient) -> None:
    names = names_on_every_node(client, per_node=2, stem="adm")
    held = [client.lease(name, ttl=30, heartbeat=False) for name in names]
    for lease in held:
        assert lease.acquire()
    rw = client.rwlock(names[0]).read(ttl=30, heartbeat=False)
    assert rw.acquire()
    listed = client.locks()
    assert sorted(i.name for i in listed if i.kind == "lease") == sorted(names)
    assert [i.name for i in listed if i.kind == "read"] == [names[0]]
    assert client.clear(names[1], force=True)
    assert client.lease(names[1], heartbeat=False).acquire()
    result = CliRunner().invoke(
        commands.main, ["--url", cluster.url, "--prefix", client.prefix, "list", "--json"]
    )
    assert result.exit_code == 0, result.output
    for name in names:
        assert name in result.output
    cleared = CliRunner().invoke(
        commands.main,
        ["--url", cluster.url, "--prefix", client.prefix, "clear", "--all", "--force"] + ["--yes"],
    )
    assert cleared.exit_code == 0, cleared.output
    assert client.locks() == []
    for name in names:
        with client.lease(name) as lease:
            assert lease.held


def test_a_listing_skips_keys_of_another_type_on_every_master(client: LockClient) -> None:
    """A key of another type on a listing's pattern, on each master, is skipped and counted
    (the Cluster pipeline keeps its WRONGTYPE reply in place), and the locks still listed."""
    names = names_on_every_node(client, stem="foreign")
    foreign = [client.connection.keys(name).base + b"done:x}:lock" for name in names]
    assert {node_port(client, key) for key in foreign} == {
        node_port(client, client.connection.keys(name).lock) for name in names
    }
    assert len({node_port(client, key) for key in foreign}) == 3
    for key in foreign:
        client.redis.set(key, 0)
    held = client.lease(names[0], ttl=30, heartbeat=False)
    assert held.acquire()

    listed = client.locks()

    assert [info.name for info in listed] == [names[0]] and listed.skipped == 3
    held.release()
    client.redis.delete(*foreign)


def test_scripts_reload_after_flush_on_every_node(cluster: Cluster, client: LockClient) -> None:
    names = names_on_every_node(client, stem="flush")
    held = [client.lease(name, ttl=1.2) for name in names]
    for lease in held:
        assert lease.acquire()
    client.redis.script_flush()  # every primary
    heartbeat().tick()  # a pipeline per node: NOSCRIPT, reload, run again
    for lease in held:
        lease.check()
        lease.release()
    with client.multi(names, ttl=5) as multi:  # direct script calls reload as well
        assert multi.held


def test_celery_setting_takes_a_cluster_url(cluster: Cluster) -> None:
    app = Celery(f"csltest-{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.conf.update(broker_url="memory://", singleton_lock_url=cluster.url)
    client = lock_client_for(app)
    try:
        assert isinstance(client.redis, RedisCluster)
        with client.lease(f"celery-{uuid.uuid4().hex}", ttl=5) as lease:
            assert lease.held
    finally:
        client.close()


def test_skip_messages_name_holders_on_a_cluster(client: LockClient) -> None:
    from celery_singleton_lock.celery.holders import describe, holders_of

    lease = client.lease("alpha", owner_info={"task_id": "t1"})
    assert lease.acquire(0)
    blocked = client.lease("alpha")
    assert not blocked.acquire(0)
    assert describe(holders_of(blocked)) == "held by task t1"
    lease.release(delay=30)
    assert describe(holders_of(blocked)).startswith("in a release delay until 20")
    names = names_on_every_node(client, stem="held")
    multi = client.multi(names, owner_info={"task_id": "t2"})
    assert multi.acquire(0)
    assert describe(holders_of(client.multi(names))) == "held by task t2"
    writer = client.rwlock("rw").write(owner_info={"task_id": "t3"})
    assert writer.acquire(0)
    assert describe(holders_of(client.rwlock("rw").write())) == "held by task t3"
    multi.release()
    writer.release()


def test_an_acquire_does_not_free_a_claim_in_another_slot(client: LockClient) -> None:
    """A queue claim's keys are another name's, in another slot: on a Cluster the run frees
    it in a call of its own (free_first says so and changes nothing)."""
    claim = client.lease("job#queued", ttl=60, heartbeat=False, owner="claim:t1:0")
    assert claim.acquire(0)
    lease = client.lease("job", ttl=10)
    assert lease.free_first("job#queued", "claim:t1:0") is False
    assert lease.acquire(0) and lease.freed_first is None
    assert [holder.owner for holder in client.holders("job#queued")] == ["claim:t1:0"]
    lease.release()
    claim.release()
