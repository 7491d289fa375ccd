"""Reader-writer key layouts during a rolling upgrade: processes of the previous release
(layout 1: reader-writer locks on the interval engine, whose ``B exp`` is a sorted set of
every holder's expiry) and of this one (layout 2: ``B exp`` is the lock hash) share one
Redis. They do not interoperate: each refuses a lock the other holds, loudly (this release
with a LockError naming the rolling upgrade, the previous one with Redis's WRONGTYPE), so
that two holders never get in silently. A lock nobody holds passes between them freely.

The previous release's scripts are run from tests/support/rw_layout1/ (the files as released).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_singleton_lock import LockClient, LockError
from celery_singleton_lock.core.holder import HOSTNAME
from celery_singleton_lock.core.keys import FENCE_TTL_MS
from celery_singleton_lock.core.scripts import pack_holder
from celery_singleton_lock.exceptions import LockBackendError
from celery_singleton_lock.kinds import rwlock
from celery_singleton_lock.kinds.intervals import interval_keys

RW_LAYOUT1 = Path(__file__).resolve().parent / "support" / "rw_layout1"


class RWLayout1:
    """A process of the previous release taking, renewing and freeing reader-writer holds
    (interval_acquire/release/renew.lua as released, with the helpers it registered them with)."""

    def __init__(self, client: LockClient) -> None:
        self.client = client

        def script(*parts: str) -> Any:
            text = "\n".join((RW_LAYOUT1 / f"{part}.lua").read_text() for part in parts)
            return client.redis.register_script(text)

        overlap = ("fencing", "interval_common", "interval_overlap")
        self.acquire_script = script(*overlap, "interval_acquire")
        self.release_script = script("interval_common", "interval_release")
        self.renew_script = script(*overlap, "interval_renew")

    def keys(self, name: str) -> Any:
        return interval_keys(self.client.prefix, name, b"rw")

    def acquire(self, name: str, mode: str, *, task_id: str = "t-old") -> tuple[str, int] | None:
        """(owner, fencing token) of a hold it took, None if blocked."""
        keys = self.keys(name)
        owner = uuid.uuid4().hex
        holder = pack_holder([
            b"name", name, b"kind", rwlock.MODE_NAMES[mode], b"host", HOSTNAME,
            b"pid", os.getpid(), b"thread", b"old-thread", b"heartbeat", 0, b"task_id", task_id,
        ])  # fmt: skip
        args = [
            owner, mode, "-inf", "inf", 30_000, 0, FENCE_TTL_MS, 0, "", keys.channel, "", holder,
        ]  # fmt: skip
        code, value = self.acquire_script(keys=keys.all(owner), args=args)
        return (owner, int(value)) if int(code) == 1 else None

    def release(self, name: str, owner: str) -> int:
        keys = self.keys(name)
        return int(
            self.release_script(keys=keys.all(owner)[:12], args=[owner, 0, keys.channel, "", ""])
        )

    def renew(self, name: str, owner: str) -> int:
        keys = self.keys(name)
        (code,) = self.renew_script(
            keys=[*keys.indexes, keys.holder(owner)], args=[owner, 30_000, 0]
        )
        return int(code)


def wrongtype(error: BaseException) -> bool:
    return "WRONGTYPE" in str(error)


@pytest.mark.parametrize("old_mode", ["r", "u", "w"])
@pytest.mark.parametrize("new_mode", ["read", "upgradable", "write"])
def test_a_previous_release_hold_is_refused_loudly_by_this_release(
    lock_client: LockClient, old_mode: str, new_mode: str
) -> None:
    old = RWLayout1(lock_client)
    taken = old.acquire("mixed", old_mode)
    assert taken is not None
    handle = getattr(lock_client.rwlock("mixed"), new_mode)(heartbeat=False)
    with pytest.raises(LockError, match="earlier release") as raised:
        handle.acquire(wait=0)
    assert not isinstance(raised.value, LockBackendError)  # a refusal, not an outage
    assert not handle.held
    # Also when it would wait: refused at once, not retried as an outage would be.
    with pytest.raises(LockError, match="rolling upgrade"):
        handle.acquire(wait=5)
    assert old.renew("mixed", taken[0]) > 0  # the old hold goes on, untouched
    assert old.release("mixed", taken[0]) == 1
    with handle:  # free: this release takes it
        assert handle.token is not None and handle.token > taken[1]


@pytest.mark.parametrize("new_mode", ["read", "upgradable", "write"])
@pytest.mark.parametrize("old_mode", ["r", "u", "w"])
def test_this_releases_hold_is_refused_loudly_by_the_previous_release(
    lock_client: LockClient, new_mode: str, old_mode: str
) -> None:
    old = RWLayout1(lock_client)
    handle = getattr(lock_client.rwlock("mixed"), new_mode)(heartbeat=False)
    with handle:
        with pytest.raises(redis.ResponseError) as raised:
            old.acquire("mixed", old_mode)
        assert wrongtype(raised.value)
        assert handle.held
        assert lock_client.redis.exists(handle.keys.holder(handle.owner or ""))
    assert old.acquire("mixed", old_mode) is not None  # free again: the old release takes it


def test_the_previous_releases_renewal_of_a_lost_hold_meets_wrongtype(
    lock_client: LockClient,
) -> None:
    """An old hold that ran out while this release took the lock: its owner's renewal fails
    loudly, its release finds nothing of its own (not held); neither touches the new hold."""
    old = RWLayout1(lock_client)
    owner, _ = old.acquire("lost", "w") or ("", 0)
    keys = old.keys("lost")
    lock_client.redis.delete(*keys.indexes, keys.holder(owner))  # as if it ran out
    reader = lock_client.rwlock("lost").read(heartbeat=False)
    with reader:
        with pytest.raises(redis.ResponseError) as raised:
            old.renew("lost", owner)
        assert wrongtype(raised.value)
        assert old.release("lost", owner) == 0
        assert reader.held and lock_client.redis.exists(reader.keys.holder(reader.owner or ""))
    assert not lock_client.redis.exists(reader.keys.lock)  # its release left nothing behind


def test_tokens_keep_increasing_across_the_layouts(lock_client: LockClient) -> None:
    old = RWLayout1(lock_client)
    rw = lock_client.rwlock("tokens")
    tokens = []
    for _ in range(3):
        owner, token = old.acquire("tokens", "w") or ("", 0)
        tokens.append(token)
        assert old.release("tokens", owner) == 1
        with rw.write(heartbeat=False) as writer:
            assert writer.token is not None
            tokens.append(writer.token)
    assert tokens == sorted(set(tokens)), tokens


def test_this_releases_admin_lists_an_old_hold_and_refuses_to_clear_it(
    lock_client: LockClient,
) -> None:
    old = RWLayout1(lock_client)
    owner, token = old.acquire("listed", "r", task_id="t-9") or ("", 0)
    (held,) = rwlock.list_holders(lock_client, "listed")
    assert (held["kind"], held["token"], held["task_id"], held["owner"]) == (
        "read", token, "t-9", owner,
    )  # fmt: skip
    with pytest.raises(LockBackendError, match="WRONGTYPE"):
        rwlock.clear_holder(lock_client, "listed", owner, token)
    assert old.renew("listed", owner) > 0  # left whole
    assert old.release("listed", owner) == 1


def test_the_previous_releases_clear_of_this_releases_hold_meets_wrongtype(
    lock_client: LockClient,
) -> None:
    old = RWLayout1(lock_client)
    keys = old.keys("cleared")
    for mode in ("read", "upgradable", "write"):
        handle = getattr(lock_client.rwlock("cleared"), mode)(heartbeat=False)
        with handle:
            owner, token = handle.owner or "", str(handle.token)
            with pytest.raises(redis.ResponseError) as raised:  # by owner and fencing token
                old.release_script(
                    keys=keys.all(owner)[:12], args=[owner, 0, keys.channel, token, ""]
                )
            assert wrongtype(raised.value)
            assert lock_client.redis.exists(handle.keys.holder(owner))  # left whole
