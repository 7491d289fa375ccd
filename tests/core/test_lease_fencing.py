"""The fencing counter: tokens strictly increase per name whatever the counter key does
(fencing.lua: one ``SET ... PXAT ... GET`` records the clock's token, with the counter's
expiry, and reads the last one). A real clock stepped back: test_fencing_clock.py."""

from __future__ import annotations

from celery_singleton_lock import LockClient
from celery_singleton_lock.core.replies import Reply, acquire_outcome
from celery_singleton_lock.core.scripts import run_batch
from celery_singleton_lock.embedded import RedisServer
from celery_singleton_lock.kinds.lease import packed_lease_holder


def server_us(client: LockClient) -> int:
    seconds, micros = client.redis.time()
    return int(seconds) * 1_000_000 + int(micros)


#: fencing.lua's FENCE_SLACK_MS: how long past the time its token stands for a counter lives.
SLACK_MS = 10_000


def assert_counter_expires(client: LockClient, fence_key: bytes) -> None:
    """The counter expires SLACK_MS after the server time its token stands for."""
    pipe = client.redis.pipeline()
    pipe.get(fence_key).pttl(fence_key).time()
    token, pttl, (seconds, micros) = pipe.execute()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    assert 0 < pttl <= int(token) // 1000 + SLACK_MS - now_ms + 1
    assert pttl > int(token) // 1000 + SLACK_MS - now_ms - 1000


def test_counter_ahead_of_the_clock_is_followed(lock_client: LockClient) -> None:
    # As after the server clock stepped back by about eleven days.
    lease = lock_client.lease("ahead", heartbeat=False)
    ahead = server_us(lock_client) + 10**12
    lock_client.redis.set(lease.keys.fence, ahead, px=60_000)
    tokens = []
    for _ in range(3):
        with lease:
            tokens.append(lease.token)
            assert_counter_expires(lock_client, lease.keys.fence)
    assert tokens == [ahead + 1, ahead + 2, ahead + 3]
    assert int(lock_client.redis.get(lease.keys.fence)) == ahead + 3


def test_counter_behind_the_clock_is_overtaken_and_keeps_an_expiry(
    lock_client: LockClient,
) -> None:
    lease = lock_client.lease("behind", heartbeat=False)
    lock_client.redis.set(lease.keys.fence, 5)  # no expiry: as if written by hand
    before = server_us(lock_client)
    with lease:
        assert lease.token is not None and lease.token >= before
        assert int(lock_client.redis.get(lease.keys.fence)) == lease.token
        assert_counter_expires(lock_client, lease.keys.fence)


def test_a_name_keeps_its_counter_for_the_slack_only(lock_client: LockClient) -> None:
    """The counter outlives the name's LAST token by the slack (not its first), also when it
    is ahead of the clock (then by the slack after the time that token stands for)."""
    lease = lock_client.lease("refreshed", heartbeat=False)
    with lease:
        pass
    assert_counter_expires(lock_client, lease.keys.fence)
    assert lock_client.redis.pttl(lease.keys.fence) <= SLACK_MS
    lock_client.redis.pexpire(lease.keys.fence, 5)
    with lease:
        assert_counter_expires(lock_client, lease.keys.fence)
    ahead = server_us(lock_client) + 10**9  # 1000 s ahead
    lock_client.redis.set(lease.keys.fence, ahead, px=5_000)
    with lease:
        assert lease.token == ahead + 1
        assert_counter_expires(lock_client, lease.keys.fence)
    assert lock_client.redis.pttl(lease.keys.fence) > 1000 * 1000


def test_many_acquisitions_within_one_millisecond_get_increasing_tokens(
    lock_client: LockClient,
) -> None:
    lease = lock_client.lease("burst", heartbeat=False)
    with lease:  # loads the scripts
        first = lease.token
    scripts = lock_client.connection.scripts
    keys = lease.keys
    holder = packed_lease_holder(lease.name, lease.heartbeat, lease.owner_info)
    calls = []
    for i in range(300):  # in one pipeline: many within one millisecond of the server's clock
        owner = f"owner-{i}"
        calls.append(scripts.acquire_call(keys.lock, keys.fence, owner, 30_000, 0, holder))
        calls.append(scripts.release_call(keys.lock, owner, 0))
    replies = run_batch(lock_client.redis, calls)
    outcomes = [acquire_outcome(reply) for reply in replies[::2]]
    assert all(code == Reply.DONE for code, _ in outcomes)
    tokens = [token for _, token in outcomes]
    assert replies[1::2] == [1] * 300
    assert [first, *tokens] == sorted(set([first, *tokens]))
    # The burst really packed several acquisitions into one millisecond of server time.
    assert len({token // 1000 for token in tokens}) < len(tokens)


def test_tokens_increase_after_the_counter_is_deleted_and_after_a_restart(
    restartable_redis: RedisServer, lock_prefix: str
) -> None:
    client = LockClient.from_url(restartable_redis.url, prefix=lock_prefix)
    try:
        lease = client.lease("restarted", heartbeat=False)
        with lease:
            first = lease.token
        client.redis.delete(lease.keys.fence)
        with lease:
            second = lease.token
        restartable_redis.stop()
        restartable_redis.start()  # empty: no counter, scripts not loaded
        with lease:
            third = lease.token
            assert_counter_expires(client, lease.keys.fence)
        assert first is not None and second is not None and third is not None
        assert first < second < third
    finally:
        client.close()


def test_a_counter_set_back_still_gives_tokens_above_every_one_handed_out(
    lock_client: LockClient,
) -> None:
    """As after a failover to a replica that had the counter but not its last writes: the
    tokens handed out since must not come again (the clock, not the counter, says so)."""
    lease = lock_client.lease("set-back", heartbeat=False)
    with lease:
        first = lease.token
    seen = []
    for _ in range(5):
        with lease:
            seen.append(lease.token)
    assert first is not None
    lock_client.redis.set(lease.keys.fence, first, px=60_000)  # the replica's counter
    with lease:
        assert lease.token is not None and lease.token > max(seen)


def test_interval_locks_follow_a_counter_ahead_of_the_clock(lock_client: LockClient) -> None:
    # Reader-writer holds share the counter of the lease of the same name.
    lease = lock_client.lease("shared", heartbeat=False)
    ahead = server_us(lock_client) + 10**12
    lock_client.redis.set(lease.keys.fence, ahead, px=60_000)
    rw = lock_client.rwlock("shared")
    tokens = []
    for hold in (rw.read(heartbeat=False), rw.write(heartbeat=False), lease):
        with hold:
            tokens.append(hold.token)
        assert_counter_expires(lock_client, lease.keys.fence)
    assert tokens == [ahead + 1, ahead + 2, ahead + 3]


def test_multi_key_locks_follow_counters_ahead_of_and_behind_the_clock(
    lock_client: LockClient,
) -> None:
    # Each name of a multi-key lock shares its counter with the lease of that name.
    ahead_lease = lock_client.lease("m-ahead", heartbeat=False)
    behind_lease = lock_client.lease("m-behind", heartbeat=False)
    ahead = server_us(lock_client) + 10**12
    lock_client.redis.set(ahead_lease.keys.fence, ahead, px=60_000)
    lock_client.redis.set(behind_lease.keys.fence, 5)  # no expiry: as if written by hand
    before = server_us(lock_client)
    multi = lock_client.multi(["m-ahead", "m-behind"], heartbeat=False)
    with multi:
        tokens = multi.tokens
    assert tokens["m-ahead"] == ahead + 1
    assert tokens["m-behind"] >= before
    for lease in (ahead_lease, behind_lease):
        assert_counter_expires(lock_client, lease.keys.fence)
    with ahead_lease:
        assert ahead_lease.token == ahead + 2
