"""os.fork() while holding a lease: the child holds none of its parent's leases."""

from __future__ import annotations

import time
from typing import Any

import pytest
from support.forked import FORKS_WITH_THREADS, run_in_child

from celery_singleton_lock import LockClient, LockNotHeld
from celery_singleton_lock.core.heartbeat import heartbeat


def _child(client: LockClient, parent_lease: Any, parent_owner: str, ttl: float) -> dict[str, Any]:
    """Runs in the forked child; returns what it found (``parent_owner``: the parent's
    lease's owner token, read in the parent: in the child its handle holds nothing)."""
    report: dict[str, Any] = {"held": parent_lease.held, "lost": parent_lease.lost}
    try:
        parent_lease.release()
        report["release"] = "released"
    except LockNotHeld:
        report["release"] = "LockNotHeld"
    report["renewing_parent_lease"] = heartbeat().holds(parent_lease)
    own = client.lease("child-own", ttl=ttl)
    report["acquired"] = own.acquire()
    token = own.token
    started = time.monotonic()
    while time.monotonic() - started < 3 * ttl:  # time passing is the thing tested
        own.check()
        time.sleep(0.05)
    report["own_held"] = own.held
    report["own_token_kept"] = int(client.redis.hget(own.keys.lock, "token")) == token
    report["own_heartbeat_thread"] = heartbeat().running
    own.release()
    # The parent's lease is untouched in Redis by anything the child did.
    report["parent_owner_intact"] = (
        client.redis.hget(parent_lease.keys.lock, "owner") == parent_owner.encode()
    )
    return report


@pytest.mark.timeout(60)
@FORKS_WITH_THREADS
def test_forked_child_holds_nothing_and_renews_its_own_leases(lock_client: LockClient) -> None:
    ttl = 0.6
    lease = lock_client.lease("parent", ttl=ttl)
    assert lease.acquire()
    token = lease.token
    parent_ticks = heartbeat().ticks
    owner = lease.owner
    assert owner is not None
    report = run_in_child(lambda: _child(lock_client, lease, owner, ttl))
    assert report == {
        "held": False,
        "lost": False,
        "release": "LockNotHeld",
        "renewing_parent_lease": False,
        "acquired": True,
        "own_held": True,
        "own_token_kept": True,
        "own_heartbeat_thread": True,
        "parent_owner_intact": True,
    }
    # Meanwhile (over three ttls) the parent's heartbeat kept renewing the parent's lease.
    assert heartbeat().ticks >= parent_ticks + 3
    lease.check()
    assert lease.held
    assert int(lock_client.redis.hget(lease.keys.lock, "token")) == token
    assert lock_client.redis.pttl(lease.keys.lock) > 0
    lease.release()
