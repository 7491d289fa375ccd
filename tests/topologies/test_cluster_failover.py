"""Redis Cluster failover: three masters with one replica each, a master SIGKILLed and its
replica promoted by the cluster itself (node timeout 2 s, so a few seconds). What happens to
the locks across it:

- a lease the replica had synced is kept: same owner on the promoted node, and the holder's
  heartbeat renews it there;
- a lease shorter than the failover is reported lost (``on_lost``), never silently held;
- a new acquisition follows the new slot map, with a larger fencing token than before;
- the admin listing scans the surviving masters, the dead one does not break it;
- a waiter blocked across the failover is woken by a release made after it, whether its
  lock (and so its channel's subscription) was on a surviving master or on the one that
  died (the channel then subscribed on the promoted replica).

Every test starts its own cluster (it kills a node of it).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from support.redis_topologies import (
    Cluster,
    Server,
    cluster_info,
    cluster_nodes,
    cluster_ok,
    running,
    slot_owner,
    wait_until,
)
from test_cluster import node_port
from test_sentinel import acquire_eventually

from celery_singleton_lock import LockClient, LockExpired, LockLost
from celery_singleton_lock.core.heartbeat import heartbeat

#: A lease that must outlive the failover. Renewed just before the kill, it lasts this long;
#: the heartbeat's first renewal on the promoted node comes within the failover (about 4 s
#: here, about 12 s when a starved machine makes the replica lose its first election and
#: retry) plus one tick (ttl / 3): a failover of up to 13 s keeps it.
KEPT_TTL = 20.0


#: Promotion takes about 4 s here (node timeout 2 s); generous because a loaded machine can
#: delay the failure reports and the votes, and a lost election is retried only after twice
#: its own timeout (the replica may always retry: see the topology's validity factor).
PROMOTION_TIMEOUT = 90


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with running(Cluster(3, replicas=1)) as topology:
        yield topology


@pytest.fixture
def client(cluster: Cluster) -> Iterator[LockClient]:
    made = LockClient.from_url(
        cluster.url_with_all_nodes, prefix=f"csltest:{uuid.uuid4().hex[:12]}:"
    )
    yield made
    made.close()


def names_on(
    client: LockClient, cluster: Cluster, index: int, stem: str, count: int = 1
) -> list[str]:
    """``count`` lock names whose keys live on master ``index``."""
    first, last = cluster.slot_range(index)
    names: list[str] = []
    i = 0
    while len(names) < count:
        name = f"{stem}{i}"
        i += 1
        key = client.connection.keys(name).lock
        if node_port(client, key) == cluster.ports[index]:
            assert first <= client.redis.keyslot(key) <= last
            names.append(name)
    return names


def direct(port: int) -> redis.Redis:
    """One connection to one node, allowed to read from a replica (``READONLY``)."""
    node = redis.Redis(port=port, socket_timeout=5, single_connection_client=True)
    node.execute_command("READONLY")
    return node


def fail_over(
    cluster: Cluster, index: int = 0, before_promotion: Callable[[], object] | None = None
) -> tuple[int, float]:
    """SIGKILL master ``index``; once every surviving node maps its slots to its replica and
    the cluster is ok again, return the replica's port and the seconds since the kill.
    ``before_promotion``: called after the kill, with the replica kept from taking over
    until it returns (``cluster-replica-no-failover``)."""
    master = cluster.servers[index]
    (replica,) = cluster.replicas[index]
    first, last = cluster.slot_range(index)
    survivors = [cluster.node(s.port) for s in cluster.all_servers if s is not master]
    size = len(cluster.all_servers)  # the dead master stays a known (failed) node
    if before_promotion is not None:
        set_failover(cluster, replica, allowed=False)
    killed_at = time.monotonic()
    master.kill()
    try:
        if before_promotion is not None:
            before_promotion()
            set_failover(cluster, replica, allowed=True)
        for node in survivors:
            try:
                wait_until(
                    lambda node=node: (
                        slot_owner(node, first) == slot_owner(node, last) == replica.port
                        and cluster_ok(node, size)
                    ),
                    PROMOTION_TIMEOUT,
                    f"every surviving node to see the replica on {replica.port} promoted",
                )
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}\n{failover_state(cluster, master, replica, survivors)}"
                ) from None
        took = time.monotonic() - killed_at
        promoted = cluster.node(replica.port)
        assert promoted.info("replication")["role"] == "master"
        promoted.close()
    finally:
        for node in survivors:
            node.close()
    return replica.port, took


def set_failover(cluster: Cluster, replica: Server, *, allowed: bool) -> None:
    """Let ``replica`` take over from its failed master by itself, or keep it from doing so."""
    node = cluster.node(replica.port)
    try:
        node.config_set("cluster-replica-no-failover", "no" if allowed else "yes")
    finally:
        node.close()


#: A replica whose master is down retries the sync every second, three log lines each time:
#: left out of an error, so that its tail shows the election's lines instead (the delay and
#: rank, "Currently unable to failover" and why, the votes, the win).
SYNC_RETRY_LINES = (
    "Connecting to MASTER",
    "MASTER <-> REPLICA sync started",
    "Error condition on socket for SYNC",
)


#: What a master logs about the votes it is asked for ("Failover auth granted to ...", or
#: "Failover auth denied to ...: <why>") and about failure reports.
VOTE_LINES = ("Failover auth", "FAIL message", "Marking node")


def failover_state(
    cluster: Cluster, master: Server, replica: Server, survivors: list[redis.Redis]
) -> str:
    """For an error: how each surviving node sees the cluster, the dead master and its
    replica (was the master flagged ``fail``, does the replica still show as ``slave``?),
    what the other masters logged about the votes (why a vote was denied), then the
    replica's log without its sync retries."""
    lines = []
    for node in survivors:
        port = node.connection_pool.connection_kwargs["port"]
        try:
            state = cluster_info(node)
            seen = {entry["port"]: entry for entry in cluster_nodes(node).values()}
        except redis.RedisError as exc:
            lines.append(f"node {port}: {exc!r}")
            continue
        views = ", ".join(
            f"{name} {server.port}: {','.join(sorted(seen[server.port]['flags']))}"
            if server.port in seen
            else f"{name} {server.port}: unknown"
            for name, server in (("master", master), ("replica", replica))
        )
        lines.append(
            f"node {port}: cluster_state={state.get('cluster_state')}"
            f" current_epoch={state.get('cluster_current_epoch')}; {views}"
        )
    for other in cluster.servers:
        if other is not master:
            votes = [
                line for line in other.log().splitlines() if any(k in line for k in VOTE_LINES)
            ]
            lines.append(f"--- master {other.port} on votes and failures:")
            lines.extend(votes[-12:] or ["(nothing)"])
    lines.append(f"--- log of port {replica.port}, sync retries left out:")
    lines.append(replica.log(omit=SYNC_RETRY_LINES))
    return "\n".join(lines)


def server_ms(node: redis.Redis) -> int:
    seconds, micros = node.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.mark.timeout(150)
def test_synced_lease_is_kept_renewed_and_listed_across_the_failover(
    cluster: Cluster, client: LockClient
) -> None:
    (name,) = names_on(client, cluster, 0, "kept")
    key = client.connection.keys(name).lock
    lost = threading.Event()
    lease = client.lease(name, ttl=KEPT_TTL, on_lost=lambda _: lost.set())
    assert lease.acquire()
    owner = lease.owner
    assert owner is not None and lease.token is not None
    # Held on the two other masters as well, for the listing.
    others = [client.lease(names_on(client, cluster, i, f"other{i}-")[0], ttl=30) for i in (1, 2)]
    for other in others:
        assert other.acquire()
    # An admin client whose slot map is read now and not again before the failover.
    admin = LockClient.from_url(cluster.url, prefix=client.prefix)
    heartbeat().tick()  # renewed now: the failover starts a full ttl before its expiry
    cluster.wait_replicated(0)
    (replica,) = cluster.replicas[0]
    copy = direct(replica.port)
    try:
        synced = copy.hgetall(key)
        assert synced[b"owner"] == owner.encode() and int(synced[b"token"]) == lease.token
    finally:
        copy.close()

    new_port, took = fail_over(cluster, 0)
    assert new_port == replica.port and took < KEPT_TTL, took
    promoted = direct(new_port)
    try:
        # The admin listing scans the surviving masters, the promoted one included, at its
        # first call: the dead master in its old slot map does not break it.
        listed = {info.name: info for info in admin.locks()}
        assert set(listed) == {name, *(other.name for other in others)}
        for held in (lease, *others):
            info = listed[held.name]
            assert info.kind == "lease" and (info.owner, info.token) == (held.owner, held.token)

        # The holder's own heartbeat (no tick from the test) renews it on the promoted node,
        # under the same owner and fencing token: still held, not taken over.
        promoted_ms = server_ms(promoted)

        def renewed_since(ms: int) -> dict[bytes, bytes] | None:
            fields = promoted.hgetall(key)
            return fields if int(fields.get(b"renewed_ms", 0)) > ms else None

        for _ in range(2):
            fields = wait_until(
                lambda since=promoted_ms: renewed_since(since),
                KEPT_TTL,
                "a renewal on the promoted node",
            )
            assert fields[b"owner"] == owner.encode() and int(fields[b"token"]) == lease.token
            assert promoted.pttl(key) > KEPT_TTL * 1000 / 2
            lease.check()
            promoted_ms = int(fields[b"renewed_ms"])
        assert lease.held and not lease.lost and not lost.is_set()
        assert not client.lease(name).acquire()  # still exclusive on the new master
        info = next(info for info in admin.locks() if info.name == name)
        assert (info.state, info.owner) == ("live", owner)
        for held in (lease, *others):
            held.release()
        assert promoted.exists(key) == 0
        assert admin.locks() == []
    finally:
        promoted.close()
        admin.close()


@pytest.mark.timeout(150)
def test_short_lease_is_reported_lost_and_new_acquires_get_larger_tokens(
    cluster: Cluster, client: LockClient
) -> None:
    name, fresh_name = names_on(client, cluster, 0, "short", count=2)
    key = client.connection.keys(name).lock
    earlier = client.lease(fresh_name, ttl=10)
    assert earlier.acquire() and earlier.token is not None
    earlier.release()
    lost = threading.Event()
    lease = client.lease(name, ttl=1.2, on_lost=lambda _: lost.set())
    assert lease.acquire() and lease.token is not None
    cluster.wait_replicated(0)
    (replica,) = cluster.replicas[0]
    copy = direct(replica.port)
    try:  # the replica has it: what loses it is time, not replication
        assert copy.hget(key, "owner") == lease.owner.encode()  # type: ignore[union-attr]
    finally:
        copy.close()

    def reported_lost() -> None:
        # A failover takes longer than this lease (the node timeout alone is 2 s), but a
        # loaded machine can keep the heartbeat thread from running until the promoted node
        # answers its renewal (the key gone): the replica waits for the report instead.
        wait_until(lost.is_set, PROMOTION_TIMEOUT, "the heartbeat to report the lease lost")

    new_port, _ = fail_over(cluster, 0, before_promotion=reported_lost)
    # The heartbeat could not reach the slot's node for longer than the lease: lost, and
    # said so (on_lost, held, check) while the node was unreachable, before anybody else
    # could take the name.
    assert lost.is_set()
    assert lease.lost and not lease.held
    with pytest.raises(LockExpired) as raised:
        lease.check()
    assert raised.value.reason == "unreachable"
    promoted = direct(new_port)
    try:
        assert promoted.exists(key) == 0  # Redis agrees: the copy ran out at the same time
        # The client follows the new slot map: a name in the dead master's slots is taken on
        # the promoted node, with a larger fencing token than before the failover.
        fresh = acquire_eventually(client, fresh_name)
        assert fresh.token > earlier.token  # type: ignore[attr-defined]
        fresh_key = client.connection.keys(fresh_name).lock
        assert node_port(client, fresh_key) == new_port
        assert promoted.hget(fresh_key, "owner") == fresh.owner.encode()  # type: ignore[attr-defined]
        # And the lost name goes to a new holder, whose token beats the lost one's.
        again = acquire_eventually(client, name)
        assert again.token > lease.token  # type: ignore[attr-defined]
        with pytest.raises(LockLost):
            lease.release()  # the new holder is left alone
        assert promoted.hget(key, "owner") == again.owner.encode()  # type: ignore[attr-defined]
        fresh.release()  # type: ignore[attr-defined]
        again.release()  # type: ignore[attr-defined]
    finally:
        promoted.close()


def listener_ports(cluster: Cluster, channel: bytes) -> list[int]:
    """The live nodes where someone is subscribed to ``channel`` (SSUBSCRIBE: PUBSUB
    SHARDNUMSUB, per node)."""
    found = []
    for server in cluster.all_servers:
        if server.process is None or server.process.poll() is not None:
            continue
        node = cluster.node(server.port)
        try:
            if node.pubsub_shardnumsub(channel)[0][1]:
                found.append(server.port)
        finally:
            node.close()
    return found


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "lock_master", [1, 0], ids=["lock-on-a-survivor", "lock-on-the-dead-master"]
)
def test_waiter_is_woken_by_a_release_after_the_failover(
    cluster: Cluster, client: LockClient, lock_master: int
) -> None:
    # Master 0 fails over. The waiter's channel is subscribed on its lock's master: on a
    # survivor it stays there; on the dead master the connection drops, the waiter looks
    # again and the channel is subscribed on the promoted replica, which owns the slot now.
    (name,) = names_on(client, cluster, lock_master, "wake")
    channel = client.connection.keys(name).channel
    holder = client.lease(name, ttl=30)  # its expiry, the waiter's fallback, is far away
    assert holder.acquire() and holder.token is not None
    waiter = client.lease(name, ttl=10)
    got: list[bool] = []
    errors: list[BaseException] = []

    def wait_for_it() -> None:
        try:
            got.append(waiter.acquire(wait=25))
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    try:
        lock_port = cluster.ports[lock_master]
        wait_until(lambda: listener_ports(cluster, channel) == [lock_port], 10, "the SSUBSCRIBE")
        cluster.wait_replicated(0)
        fail_over(cluster, 0)
        # Still waiting, and subscribed on the node that owns the slot now.
        assert thread.is_alive() and not errors, errors
        owner = cluster.replicas[0][0].port if lock_master == 0 else lock_port
        wait_until(lambda: listener_ports(cluster, channel) == [owner], 20, "the resubscribe")
        released_at = time.monotonic()
        holder.release()
        thread.join(20)
        assert not errors and got == [True], errors
        assert time.monotonic() - released_at < 2.0, "woken by the release, not its 30 s hint"
        assert waiter.token is not None and waiter.token > holder.token
        waiter.release()
    finally:
        thread.join(30)


@pytest.mark.timeout(150)
def test_a_lease_on_a_surviving_master_works_while_another_master_is_down(
    cluster: Cluster, client: LockClient
) -> None:
    """A script a healthy node has not cached yet is loaded on that node only: redis-py's own
    Script loads it on every primary, and the dead one failed the release of a lock that
    lives on a node that is up."""
    (name,) = names_on(client, cluster, 1, "beside")
    lease = client.lease(name, ttl=30, heartbeat=False)
    assert lease.acquire()
    assert lease.extend() == pytest.approx(30, abs=0.5)
    cluster.servers[0].kill()  # master 0 down, its replica not promoted yet
    assert lease.extend() == pytest.approx(30, abs=0.5)
    lease.release()  # release.lua was never run on master 1: loaded there, now
    assert direct(cluster.ports[1]).exists(client.connection.keys(name).lock) == 0
