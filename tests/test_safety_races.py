"""Interleavings that used to break a lock's promises, each driven step by step.

- A renewal already decided on (the heartbeat read its owner tokens, or its batch was on the
  wire) when ``release(delay=...)`` runs must not cut the delay-after short, whatever kind.
- A reader-writer or range hold in delay-after is listed as a cooldown, never stale, and
  ``clear --stale`` leaves it alone.
"""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner, Result

from celery_singleton_lock import LockClient, admin, cli
from celery_singleton_lock.heartbeat import heartbeat, renew_calls
from celery_singleton_lock.scripts import run_batch

#: The delay-after the tests release with, and the least PTTL that shows it is intact.
DELAY = 60.0
INTACT_MS = 50_000


def renew_as_sent(client: LockClient, handle: Any, owner: str) -> list[int]:
    """Run the renewal the heartbeat builds for ``handle`` with owner token ``owner``."""
    calls, decode = renew_calls(client, [(handle, owner, handle._ttl_ms)])
    return decode(client._call(run_batch, client.redis, calls))


def make_handle(client: LockClient, kind: str) -> Any:
    if kind == "lease":
        return client.lease("cool", ttl=3)
    if kind == "multi":
        return client.multi(["cool-a", "cool-b"], ttl=3)
    if kind == "read":
        return client.rwlock("cool").read(ttl=3)
    if kind == "write":
        return client.rwlock("cool").write(ttl=3)
    assert kind == "range"
    return client.range_lock("cool").write(0, 10, ttl=3)


def hold_keys(handle: Any, owner: str) -> list[bytes]:
    """The keys whose expiry is the hold's delay-after."""
    from celery_singleton_lock.intervals import IntervalHandle
    from celery_singleton_lock.multi import MultiLease

    if isinstance(handle, MultiLease):
        return [k.lock for k in handle._keys]
    if isinstance(handle, IntervalHandle):
        return [handle._keys.holder(owner)]
    return [handle._keys.lock]


def assert_delay_intact(client: LockClient, handle: Any, owner: str) -> None:
    for key in hold_keys(handle, owner):
        assert client.redis.pttl(key) > INTACT_MS, key
    if hasattr(handle, "mode"):  # an interval hold: its index entry keeps the interval locked
        now_ms = int(client.server_time() * 1000)
        expiry = client.redis.zscore(handle._keys.indexes[0], owner)
        assert expiry is not None and expiry - now_ms > INTACT_MS


KINDS = ["lease", "multi", "read", "write", "range"]


@pytest.mark.parametrize("kind", KINDS)
def test_renewal_with_the_old_owner_after_a_delayed_release(
    lock_client: LockClient, kind: str
) -> None:
    # The tick read the owner token, then the holder released with a delay, then the
    # renewal reached Redis.
    handle = make_handle(lock_client, kind)
    assert handle.acquire()
    owner = handle._owner
    handle.release(delay=DELAY)
    (code,) = renew_as_sent(lock_client, handle, owner)
    assert code <= 0
    assert_delay_intact(lock_client, handle, owner)
    assert not handle.lost  # a released handle is not lost for a late renewal


@pytest.mark.parametrize("kind", KINDS)
def test_tick_of_a_handle_released_after_it_was_listed(lock_client: LockClient, kind: str) -> None:
    # The tick listed the handle, then the holder released (dropping its owner token), then
    # the tick read the owner tokens and renewed.
    handle = make_handle(lock_client, kind)
    assert handle.acquire()
    owner = handle._owner
    handle.release(delay=DELAY)
    heartbeat()._renew([handle])
    assert_delay_intact(lock_client, handle, owner)


def test_lease_renewal_never_matches_an_ownerless_delay_after(lock_client: LockClient) -> None:
    # Whatever a caller sends, an empty owner token is no owner.
    lease = lock_client.lease("cool", ttl=3)
    assert lease.acquire()
    lease.release(delay=DELAY)
    calls = [lock_client._scripts.renew_call([(lease._keys.lock, "", 3000)])]
    assert lock_client._call(run_batch, lock_client.redis, calls) == [[-1]]
    assert lock_client.redis.pttl(lease._keys.lock) > INTACT_MS
    both = lock_client.multi(["m-a", "m-b"], ttl=3)
    assert both.acquire()
    both.release(delay=DELAY)
    (code,) = renew_as_sent(lock_client, both, "")
    assert code == -1
    assert_delay_intact(lock_client, both, "")


# -- a reader-writer or range hold in delay-after is a cooldown, and --stale leaves it -------


def run_plain(client: LockClient, lock_redis_url: str, *args: str) -> Result:
    """``python -m celery_singleton_lock --url URL --prefix PREFIX ARGS``, in process."""
    options = ["--url", lock_redis_url, "--prefix", client.prefix]
    return CliRunner().invoke(cli.main, [*options, *args], catch_exceptions=False)


def age_renewal(client: LockClient, key: bytes) -> None:
    """Make the hold's last renewal look a minute old (as after a minute of delay-after)."""
    client.redis.hset(key, "renewed_ms", admin.server_ms(client) - 60_000)


@pytest.mark.parametrize("kind", ["read", "write", "range"])
def test_interval_hold_in_delay_after_is_listed_cooldown(
    lock_client: LockClient, lock_redis_url: str, kind: str
) -> None:
    handle = make_handle(lock_client, kind)
    assert handle.acquire()
    owner = handle._owner
    handle.release(delay=DELAY)
    age_renewal(lock_client, handle._keys.holder(owner))
    (info,) = lock_client.locks("cool")
    assert (info.state, info.evidence, info.heartbeat_age_s) == ("cooldown", "delay-after", None)
    assert info.token == handle.token

    result = run_plain(lock_client, lock_redis_url, "clear", "--stale", "--yes")
    assert result.exit_code == 1, result.output  # nothing stale: nothing cleared
    assert_delay_intact(lock_client, handle, owner)
    assert [i.state for i in lock_client.locks("cool")] == ["cooldown"]

    # Cleared by name, as a lease's delay-after is: explicit, and not live.
    assert lock_client.clear("cool") is True
    assert lock_client.locks("cool") == []
