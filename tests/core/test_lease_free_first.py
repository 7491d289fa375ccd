"""``Lease.free_first``: an acquire that first releases a claim held under another name, in
the same round trip (how an ``until_start``/``debounce`` run frees its queue claim)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support.waiting import wait_for_subscriber

from celery_singleton_lock import ConfigurationError, LockClient
from celery_singleton_lock.embedded import RedisServer
from celery_singleton_lock.kinds.lease import Lease

CLAIM = "job#queued"
CLAIM_OWNER = "claim:t1:0"


@pytest.fixture
def client() -> Iterator[LockClient]:
    """A client on a server of its own, so its command statistics are this test's alone."""
    with RedisServer() as server:
        lock_client = LockClient.from_url(server.url, prefix="ff:")
        yield lock_client
        lock_client.close()


def script_calls(client: LockClient) -> int:
    stats = client.redis.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def hold_claim(client: LockClient, owner: str = CLAIM_OWNER) -> Lease:
    claim = client.lease(CLAIM, ttl=60, heartbeat=False, owner=owner)
    assert claim.acquire(0)
    return claim


def claim_owner_now(client: LockClient) -> str | None:
    found = client.holders(CLAIM)
    return found[0].owner if found else None


def test_the_claim_is_freed_and_the_lease_taken_in_one_round_trip(client: LockClient) -> None:
    hold_claim(client)
    lease = client.lease("job", ttl=10)
    assert lease.free_first(CLAIM, CLAIM_OWNER)
    before = script_calls(client)
    assert lease.acquire(0)
    assert script_calls(client) == before + 1
    assert lease.freed_first == 1 and claim_owner_now(client) is None
    lease.release()


# A single try frees the claim in its acquire; a waiting acquire frees it in a call first.
@pytest.mark.parametrize("wait", [0.0, 0.2])
def test_the_claim_is_freed_even_when_the_lease_is_busy(client: LockClient, wait: float) -> None:
    hold_claim(client)
    holder = client.lease("job", ttl=10)
    assert holder.acquire(0)
    lease = client.lease("job", ttl=10)
    assert lease.free_first(CLAIM, CLAIM_OWNER)
    assert not lease.acquire(wait)
    assert lease.freed_first == 1 and claim_owner_now(client) is None
    holder.release()


@pytest.mark.parametrize("stop", [False, True])
def test_a_claim_of_another_owner_is_left_and_may_stop_the_acquire(
    client: LockClient, stop: bool
) -> None:
    hold_claim(client, owner="claim:later:0")
    lease = client.lease("job", ttl=10)
    assert lease.free_first(CLAIM, CLAIM_OWNER, stop_if_taken=stop)
    assert lease.acquire(0) is not stop
    assert lease.freed_first == -1 and claim_owner_now(client) == "claim:later:0"
    assert bool(client.holders("job")) is not stop  # stopped: the lock was not even tried
    if not stop:
        lease.release()


def test_no_claim_and_only_the_next_acquire(client: LockClient) -> None:
    lease = client.lease("job", ttl=10)
    assert lease.free_first(CLAIM, CLAIM_OWNER)
    assert lease.acquire(0) and lease.freed_first == 0
    lease.release()
    claim = hold_claim(client)  # claimed again under the same owner: the next acquire keeps it
    before = script_calls(client)
    assert lease.acquire(0)
    assert script_calls(client) == before + 1 and claim_owner_now(client) == CLAIM_OWNER
    lease.release()
    claim.release()


def test_a_waiter_on_the_claim_is_woken(client: LockClient) -> None:
    hold_claim(client)
    waiter = client.lease(CLAIM, ttl=10)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(30)), daemon=True)
    thread.start()
    wait_for_subscriber(client, client.connection.keys(CLAIM).channel)
    lease = client.lease("job", ttl=10)
    assert lease.free_first(CLAIM, CLAIM_OWNER)
    assert lease.acquire(0) and lease.freed_first == 1
    thread.join(10)  # woken by the release's message, long before its 30 s
    assert got == [True]
    waiter.release()
    lease.release()


@pytest.mark.parametrize(
    ("name", "owner", "stop", "argument"),
    [
        ("", CLAIM_OWNER, False, "name"),
        (CLAIM, "", False, "owner"),  # "" would match a hash in its release delay
        (CLAIM, None, False, "owner"),
        (CLAIM, CLAIM_OWNER, "yes", "stop_if_taken"),
    ],
)
def test_bad_arguments_are_refused_and_change_nothing(
    client: LockClient, name: Any, owner: Any, stop: Any, argument: str
) -> None:
    claim = hold_claim(client)
    lease = client.lease("job", ttl=10)
    with pytest.raises(ConfigurationError) as info:
        lease.free_first(name, owner, stop_if_taken=stop)
    assert info.value.argument == argument
    assert lease.acquire(0) and lease.freed_first is None  # nothing was arranged
    assert claim_owner_now(client) == CLAIM_OWNER
    lease.release()
    claim.release()
