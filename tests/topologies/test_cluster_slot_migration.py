"""A hash slot migrated between two masters of a real Redis Cluster (as ``redis-cli
--cluster reshard`` does it) while locks in it are held, with their heartbeats on short ttls:

- a lease, an rw read hold, a range hold, a multi-key lock and a queued fair waiter, all in
  the migrating slot, keep their holds; their keys end up on the new node; the fair waiter is
  handed the lease when its holder releases; no second client takes any of them, during or
  after; fencing tokens keep increasing;
- a script call whose keys are split between the two nodes (half-migrated: redis-py's own
  retries of TRYAGAIN run out) is sent again until the slot settles, not raised to the
  caller; an acquire in that window waits for the migration to finish and then gets its
  answer; a heartbeat pipeline's renewal so refused runs again alone; a slot left
  half-migrated past the bound raises LockBackendError; the asyncio client does the same;
- a release (lease, multi-key) or an admin clear in a migrating slot frees the lock whichever
  node has its key, though the trace and queue keys it touches without naming them are on
  the other node (or on none); so does a reader-writer release; a claim's take-over waits
  for the migration instead of dropping its undo; a release that would hand the lease to a
  queued fair waiter frees the name instead, which the waiter takes once the slot settled.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.redis_topologies import Cluster, running, wait_until
from support.slot_migration import SlotMigration, errors_seen

from celery_singleton_lock import AsyncLockClient, LockBackendError, LockClient
from celery_singleton_lock.core.heartbeat import heartbeat
from celery_singleton_lock.core.scripts import SLOT_MIGRATION_RETRY
from celery_singleton_lock.kinds.intervals import interval_keys
from celery_singleton_lock.kinds.rwlock import rw_keys

#: redis-py sends a command that gets TRYAGAIN this many times before giving up
#: (``RedisCluster.RedisClusterRequestTTL``): more TRYAGAIN replies than this for one call
#: mean that the package sent it again.
REDIS_PY_TRIES = 16

#: Short enough that the heartbeat must renew during the test (every ttl / 3).
TTL = 1.5


@pytest.fixture
def rival(cluster: Cluster, client: LockClient) -> Iterator[LockClient]:
    """A second client on the same locks (its own pool and node connections)."""
    made = LockClient.from_url(cluster.url, prefix=client.prefix)
    yield made
    made.close()


def slot_of(client: LockClient, name: str) -> int:
    return int(client.redis.keyslot(client.connection.keys(name).lock))


def names_in_slot(client: LockClient, slot: int, count: int, stem: str) -> list[str]:
    """``count`` lock names whose keys hash to ``slot``."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        name = f"{stem}{i}"
        i += 1
        if slot_of(client, name) == slot:
            found.append(name)
    return found


def another_master(cluster: Cluster, client: LockClient, key: bytes) -> int:
    owner = int(client.redis.get_node_from_key(key).port)
    return next(port for port in cluster.ports if port != owner)


def unreachable(caplog: pytest.LogCaptureFixture, client: LockClient) -> list[str]:
    """What the heartbeat logged as failed renewals on ``client``'s cluster (the process's
    heartbeat also renews what earlier tests left held on clusters since stopped)."""
    return [
        message
        for message in (record.getMessage() for record in caplog.records)
        if "heartbeat could not reach" in message and client.url in message
    ]


def in_thread(function: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``function`` run in a started thread; its result (or exception) lands in the list."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(function())
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_holds_and_a_fair_waiter_survive_their_slot_migrating(
    cluster: Cluster, client: LockClient, rival: LockClient, caplog: pytest.LogCaptureFixture
) -> None:
    slot = slot_of(client, "lease")
    rw_name, range_name, *multi_names = names_in_slot(client, slot, 4, "s")
    lease = client.lease("lease", ttl=TTL)
    read = client.rwlock(rw_name).read(ttl=TTL)
    ranged = client.range_lock(range_name).write(0, 10, ttl=TTL)
    multi = client.multi(multi_names, ttl=TTL)
    holds: list[Any] = [lease, read, ranged, multi]
    for hold in holds:
        assert hold.acquire()
    waiter = client.lease("lease", ttl=TTL, fair=True)
    waiting, handed = in_thread(lambda: waiter.acquire(wait=60))
    queue = client.connection.keys("lease").base + b"queue"
    wait_until(lambda: client.redis.llen(queue) == 1, 10, "the fair waiter to queue")

    def rivals_take_nothing() -> list[bool]:
        return [
            rival.lease("lease").acquire(),
            rival.rwlock(rw_name).write(ttl=TTL).acquire(),
            rival.range_lock(range_name).write(5, 6, ttl=TTL).acquire(),
            rival.multi(multi_names, ttl=TTL).acquire(),
        ]

    lock_key = client.connection.keys("lease").lock
    target = another_master(cluster, client, lock_key)
    migration = SlotMigration(cluster, slot, target)
    # The importing node has never run the scripts: calls sent there with ASK load them.
    migration.target.script_flush()
    try:
        migration.begin()
        # Half-migrated: the lease's hash on the target, its fencing counter on the source.
        migration.move_keys([lock_key])
        tryagain = errors_seen(migration.source, "TRYAGAIN")
        trying, tried = in_thread(rivals_take_nothing)
        wait_until(
            lambda: errors_seen(migration.source, "TRYAGAIN") > tryagain + REDIS_PY_TRIES,
            10,
            "calls on the split slot to be refused with TRYAGAIN for a while",
        )
        # Every hold renewed while its slot is split, in one pipeline: the rw and range holds
        # on the source; the lease and the multi share one renew call (same script, same
        # slot) whose keys are split: refused with TRYAGAIN, sent again until the slot settles.
        ticking, ticked = in_thread(heartbeat().tick)
        wait_until(
            lambda: errors_seen(migration.source, "TRYAGAIN") > tryagain + 2 * REDIS_PY_TRIES,
            10,
            "the heartbeat's calls on the split slot to be refused with TRYAGAIN too",
        )
        migration.finish()
        ticking.join(30)
        assert ticked == [None]
        trying.join(30)
        assert tried == [[False, False, False, False]]
    finally:
        migration.close()

    assert migration.keys_left() == []
    target_node = cluster.node(target)
    try:
        every_key = [
            lock_key,
            *(client.connection.keys(name).lock for name in multi_names),
            rw_keys(client.prefix, rw_name).lock,
            *interval_keys(client.prefix, range_name, b"range").all("o")[:1],
            queue,
        ]
        assert target_node.exists(*every_key) == len(every_key)
    finally:
        target_node.close()
    # Held past twice their ttl on the new node: the heartbeat renews them there.
    deadline = time.monotonic() + 2 * TTL
    while time.monotonic() < deadline:
        for hold in holds:
            hold.check()
        time.sleep(0.1)  # the heartbeat runs meanwhile: no event marks "renewed"
    assert rivals_take_nothing() == [False, False, False, False]
    assert not unreachable(caplog, client)
    tokens = [hold.token for hold in holds]

    lease.release()
    waiting.join(30)
    assert handed == [True]
    assert client.redis.hget(lock_key, "owner") == waiter.owner.encode()  # type: ignore[union-attr]
    assert waiter.token is not None and waiter.token > tokens[0]
    waiter.release()
    for hold in holds[1:]:
        hold.release()
    taken = [
        rival.rwlock(rw_name).write(ttl=TTL),
        rival.range_lock(range_name).write(5, 6, ttl=TTL),
        rival.multi(multi_names, ttl=TTL),
    ]
    for before, hold in zip(tokens[1:], taken, strict=True):
        assert hold.acquire()
        assert hold.token is not None and before is not None and hold.token > before
        hold.release()


def test_a_call_on_a_half_migrated_slot_is_sent_again_not_raised(
    cluster: Cluster, client: LockClient, rival: LockClient
) -> None:
    holder = client.lease("held", ttl=TTL)
    assert holder.acquire()
    # A free name of the same slot with a fencing counter: acquired and released before.
    free_name = names_in_slot(client, slot_of(client, "held"), 1, "free")[0]
    with client.lease(free_name, ttl=TTL) as earlier:
        pass
    lock_key = client.connection.keys("held").lock
    migration = SlotMigration(
        cluster, slot_of(client, "held"), another_master(cluster, client, lock_key)
    )
    try:
        migration.begin()
        migration.move_keys([lock_key])
        tryagain = errors_seen(migration.source, "TRYAGAIN")
        refused, refused_outcome = in_thread(lambda: rival.lease("held").acquire())
        wait_until(
            lambda: errors_seen(migration.source, "TRYAGAIN") > tryagain + REDIS_PY_TRIES,
            10,
            "the rival's acquire to be refused with TRYAGAIN more often than redis-py retries",
        )
        # Its fencing counter on the source, no hash anywhere: ASK, then TRYAGAIN on the target.
        free, free_outcome = in_thread(lambda: rival.lease(free_name, ttl=TTL).acquire())
        migration.finish()
        refused.join(30)
        free.join(30)
    finally:
        migration.close()
    assert refused_outcome == [False]
    assert free_outcome == [True]
    holder.check()
    holder.release()
    taker = rival.lease("held", ttl=TTL)
    assert taker.acquire()
    assert taker.token is not None and holder.token is not None and taker.token > holder.token
    assert earlier.token is not None
    taker.release()


def test_a_renewal_batch_on_a_split_slot_is_sent_again_not_failed(
    cluster: Cluster, client: LockClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The heartbeat's pipeline: a renew call whose keys are split is sent again alone."""
    slot = slot_of(client, "renewed")
    multi_names = names_in_slot(client, slot, 2, "r")
    holds: list[Any] = [
        client.lease("renewed", ttl=TTL),
        client.multi(multi_names, ttl=TTL),  # renewed with the lease: one call for the slot
        client.rwlock("renewed").read(ttl=TTL),  # a call of its own: a pipeline of two
    ]
    for hold in holds:
        assert hold.acquire()
    lock_key = client.connection.keys("renewed").lock
    migration = SlotMigration(cluster, slot, another_master(cluster, client, lock_key))
    try:
        migration.begin()
        migration.move_keys([lock_key])
        tryagain = errors_seen(migration.source, "TRYAGAIN")
        # Nothing else calls on this slot meanwhile; the renew call is in flight at most
        # twice (this tick's, the background thread's): more refusals than redis-py's tries
        # of both (the pipeline's send, then its own) mean that it gave up on one.
        ticking, ticked = in_thread(heartbeat().tick)
        wait_until(
            lambda: errors_seen(migration.source, "TRYAGAIN") > tryagain + 2 * (REDIS_PY_TRIES + 1),
            10,
            "the renewal to be refused with TRYAGAIN more often than redis-py retries",
        )
        migration.finish()
        ticking.join(30)
        assert ticked == [None]
    finally:
        migration.close()
    assert not unreachable(caplog, client)
    for hold in holds:
        hold.check()
        hold.release()


def test_a_slot_left_half_migrated_fails_the_call_after_the_bound(
    cluster: Cluster, client: LockClient, rival: LockClient
) -> None:
    holder = client.lease("stuck", ttl=30, heartbeat=False)
    assert holder.acquire()
    lock_key = client.connection.keys("stuck").lock
    target = another_master(cluster, client, lock_key)
    migration = SlotMigration(cluster, slot_of(client, "stuck"), target)
    # The importing node has never run the scripts: a call sent there with ASK loads them.
    migration.target.script_flush()
    try:
        migration.begin()
        migration.move_keys([lock_key])
        started = time.monotonic()
        with pytest.raises(LockBackendError, match="TTL exhausted"):
            rival.lease("stuck").acquire()
        assert SLOT_MIGRATION_RETRY <= time.monotonic() - started < SLOT_MIGRATION_RETRY + 10
        # A one-key call is not stuck: the source sends it on with ASK to the target, which
        # has the hash (and runs the script it did not have).
        holder.release()
        migration.finish()
    finally:
        migration.close()
    assert not holder.held
    taker = rival.lease("stuck", ttl=TTL, heartbeat=False)
    assert taker.acquire()
    assert taker.token is not None and holder.token is not None and taker.token > holder.token
    taker.release()


def test_asyncio_calls_on_a_half_migrated_slot_are_sent_again(cluster: Cluster) -> None:
    prefix = f"csltest:{uuid.uuid4().hex[:12]}:"
    sync = LockClient.from_url(cluster.url, prefix=prefix)
    slot = slot_of(sync, "held")
    free_name = names_in_slot(sync, slot, 1, "free")[0]
    lock_key = sync.connection.keys("held").lock
    target = another_master(cluster, sync, lock_key)
    sync.close()

    async def body() -> None:
        client = AsyncLockClient.from_url(cluster.url, prefix=prefix)
        rival = AsyncLockClient.from_url(cluster.url, prefix=prefix)
        migration = SlotMigration(cluster, slot, target)
        try:
            holder = client.lease("held", ttl=TTL)
            assert await holder.acquire()
            async with client.lease(free_name, ttl=TTL):  # leaves a fencing counter
                pass
            migration.begin()
            migration.move_keys([lock_key])
            tryagain = errors_seen(migration.source, "TRYAGAIN")
            refused = asyncio.create_task(rival.lease("held").acquire())
            # A fencing counter on the source, no hash anywhere: ASK, then TRYAGAIN there.
            free_lease = rival.lease(free_name, ttl=TTL)
            free = asyncio.create_task(free_lease.acquire())
            # Two calls refused at once: more refusals than redis-py's tries of both mean
            # that it gave up on one of them.
            await asyncio.to_thread(
                wait_until,
                lambda: (
                    errors_seen(migration.source, "TRYAGAIN") > tryagain + 2 * (REDIS_PY_TRIES + 1)
                ),
                10,
                "the rivals' acquires to be refused with TRYAGAIN more often than redis-py retries",
            )
            await asyncio.to_thread(migration.finish)
            assert await refused is False
            assert await free is True
            await free_lease.release()
            await holder.release()
            taker = rival.lease("held", ttl=TTL)
            assert await taker.acquire()
            assert taker.token is not None and holder.token is not None
            assert taker.token > holder.token
            await taker.release()
        finally:
            migration.close()
            await client.close()
            await rival.close()

    asyncio.run(body())


@pytest.mark.parametrize("side", ["sync", "asyncio"])
def test_replicated_calls_on_a_half_migrated_slot_are_sent_again_with_their_wait(
    side: str,
) -> None:
    """With ``replicas=1`` every call is a pipeline of its script and a WAIT: one refused
    while its slot is half-migrated is sent again alone, with its own WAIT, until the slot
    settles, rather than raised (the asyncio client used to raise it)."""
    with running(Cluster(3, replicas=1)) as cluster:
        prefix = f"csltest:{uuid.uuid4().hex[:12]}:"
        plain = LockClient.from_url(cluster.url, prefix=prefix)
        replicated = LockClient.from_url(cluster.url, prefix=prefix, replicas=1)
        slot = slot_of(plain, "held")
        lock_key = plain.connection.keys("held").lock
        target = another_master(cluster, plain, lock_key)
        # A replica that just synced acknowledges writes only after its first REPLCONF ACK:
        # wait until both masters of the migration have a replica that does.
        on_target = next(
            name
            for name in (f"warm-{i}" for i in range(10_000))
            if int(plain.redis.get_node_from_key(plain.connection.keys(name).lock).port) == target
        )
        for name in (names_in_slot(plain, slot, 1, "warm")[0], on_target):
            wait_until(lambda name=name: try_once(replicated, name), 10, f"{name!r} replicated")
        holder = plain.lease("held", ttl=30, heartbeat=False)
        assert holder.acquire()
        migration = SlotMigration(cluster, slot, target)
        loop = asyncio.new_event_loop()
        arival = AsyncLockClient.from_url(cluster.url, prefix=prefix, replicas=1)
        try:
            migration.begin()
            migration.move_keys([lock_key])
            tryagain = errors_seen(migration.source, "TRYAGAIN")
            if side == "sync":
                thread, outcome = in_thread(lambda: replicated.lease("held").acquire())
            else:
                thread, outcome = in_thread(
                    lambda: loop.run_until_complete(arival.lease("held").acquire())
                )
            wait_until(
                lambda: errors_seen(migration.source, "TRYAGAIN") > tryagain + REDIS_PY_TRIES,
                10,
                "the replicated acquire to be refused more often than redis-py retries",
            )
            migration.finish()
            thread.join(30)
            assert outcome == [False]  # answered once the slot settled: the name is held
            holder.release()
            assert wait_until(lambda: try_once(replicated, "held"), 10, "a replicated acquire")
        finally:
            migration.close()
            loop.run_until_complete(arival.close())
            loop.close()
            replicated.close()
            plain.close()


def try_once(client: LockClient, name: str) -> bool:
    """One acquire and release of ``name``; False while the replicas do not acknowledge."""
    lease = client.lease(name, heartbeat=False)
    try:
        taken = lease.acquire()
    except LockBackendError:
        return False
    if taken:
        lease.release()
    return taken


@pytest.mark.parametrize("moved", [False, True], ids=["keys-on-source", "keys-on-target"])
@pytest.mark.parametrize("kind", ["lease", "multi", "clear"])
def test_a_release_in_a_migrating_slot_frees_the_lock_a_waiter_marked(
    cluster: Cluster, client: LockClient, rival: LockClient, moved: bool, kind: str
) -> None:
    """A release touches keys it does not name (its trace, the fair waiters' queue): while
    the slot is migrating, Redis refuses a script's command on such a key that the node does
    not have (it belongs with the other node), or a two-key command with one missing. The
    release (and an admin clear) frees the lock all the same, without its trace, which is
    advisory (lua/advisory.lua)."""
    name = f"migrating-{kind}-{moved}"
    holder: Any = (
        client.lease(name, ttl=30, heartbeat=False)
        if kind == "lease"
        else client.multi([name], ttl=30, heartbeat=False)
    )
    assert holder.acquire()
    # A waiter that marked the lock (a failed attempt of a caller that will wait).
    assert not rival.lease(name, ttl=30, heartbeat=False).acquire(0.01)
    lock_key = client.connection.keys(name).lock
    assert client.redis.hget(lock_key, "waiting") is not None
    migration = SlotMigration(
        cluster, slot_of(client, name), another_master(cluster, client, lock_key)
    )
    try:
        migration.begin()
        if moved:
            migration.move_keys([lock_key])
        if kind == "clear":
            assert client.clear(name, force=True)
        else:
            holder.release()
            assert not holder.held
        assert not client.redis.exists(lock_key)
        migration.finish()
    finally:
        migration.close()
    taker = rival.lease(name, ttl=TTL, heartbeat=False)
    assert taker.acquire()
    taker.release()


@pytest.mark.parametrize("mode", ["read", "write"])
def test_a_reader_writer_release_in_a_migrating_slot_frees_the_hold(
    cluster: Cluster, client: LockClient, rival: LockClient, mode: str
) -> None:
    """The slot is migrating, none of its keys moved yet: the keys a reader-writer release
    touches without naming them (the waiters' mark and queue) may be missing here, which
    Redis refuses to a script in a migrating slot."""
    name = f"rw-migrating-{mode}"
    holder = getattr(client.rwlock(name), mode)(ttl=30, heartbeat=False)
    assert holder.acquire()
    lock_key = rw_keys(client.prefix, name).lock
    migration = SlotMigration(
        cluster, slot_of(client, name), another_master(cluster, client, lock_key)
    )
    # A writer that waits marks the lock, then gives up.
    assert not rival.rwlock(name).write(ttl=30, heartbeat=False).acquire(0.01)
    try:
        migration.begin()
        holder.release()
        assert not holder.held
        migration.finish()
    finally:
        migration.close()
    taker = rival.rwlock(name).write(ttl=TTL, heartbeat=False)
    assert taker.acquire()
    taker.release()


def test_a_claim_is_taken_over_once_its_slot_migrated(
    cluster: Cluster, client: LockClient, rival: LockClient
) -> None:
    """Taking a claim over keeps the claim aside (``P{T}:undo:<token>``, a key the script
    does not name) so that a lost reply can put it back. While the slot migrates the node
    refuses that new key: the take-over is sent again, as a split call is, and once the
    migration finished it takes the claim over, which its undo can give back."""
    name = "claimed-migrating"
    claim = client.lease(name, owner="claim:t-1:0", ttl=30, heartbeat=False)
    assert claim.acquire()
    lock_key = client.connection.keys(name).lock
    migration = SlotMigration(
        cluster, slot_of(client, name), another_master(cluster, client, lock_key)
    )
    taker = rival.lease(name, take_over="claim:t-1:0", ttl=30, heartbeat=False)
    try:
        migration.begin()
        finishing = threading.Timer(0.5, migration.finish)
        finishing.start()
        started = time.monotonic()
        assert taker.acquire()
        assert time.monotonic() - started >= 0.4  # it waited for the migration
        finishing.join()
    finally:
        migration.close()
    assert taker.token is not None and claim.token is not None and taker.token > claim.token
    taker.release()


def test_a_release_in_a_migrating_slot_leaves_the_name_to_a_queued_fair_waiter(
    cluster: Cluster, client: LockClient, rival: LockClient
) -> None:
    """A release hands the lease to the oldest fair waiter by writing the lock's hash anew,
    which a node the slot is migrating away from refuses: the release frees the name instead
    (no error), and the waiter takes it with its own attempt once the slot settled."""
    name = "fair-migrating"
    holder = client.lease(name, ttl=30, heartbeat=False)
    assert holder.acquire()
    lock_key = client.connection.keys(name).lock
    queue_key = client.connection.keys(name).base + b"queue"
    waiter = rival.lease(name, ttl=30, heartbeat=False, fair=True)
    taken = threading.Event()
    waiting = threading.Thread(target=lambda: waiter.acquire(20) and taken.set())
    waiting.start()
    migration = SlotMigration(
        cluster, slot_of(client, name), another_master(cluster, client, lock_key)
    )
    try:
        wait_until(lambda: client.redis.exists(queue_key), 10, "the waiter to queue")
        migration.begin()
        holder.release()
        assert not holder.held
        # Its attempts name the missing lock key beside existing ones: refused (TRYAGAIN)
        # until the slot settles, as any acquire of a free name there.
        migration.finish()
        assert taken.wait(10)
        assert waiter.held
    finally:
        waiting.join(20)
        migration.close()
    assert waiter.token is not None and holder.token is not None and waiter.token > holder.token
    waiter.release()
