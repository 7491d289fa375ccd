"""Lease hash layouts during a rolling upgrade: processes of the previous release (layout 1:
each holder field a hash field of its own; the fencing counter's expiry set on every token)
and of this one (layout 2: the holder fields packed in one ``holder`` field; the counter's
expiry set when it is made) share one Redis. They interoperate on what makes the lock a
lock: the owner, the fencing token and counter, the ``waiting`` mark, the release delay and
the expiry, so each excludes the other's holders and tokens keep increasing across both;
this release lists, clears and releases (``release_holder``) layout-1 holds as its own.
Reader-writer locks changed their key layout since: see test_rw_layout.py.

The previous release's scripts are run from tests/support/layout1/ (the files as released).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from celery_singleton_lock import LockClient
from celery_singleton_lock.core.holder import HOSTNAME, PACKED_FIELD, flatten, unpack_strings
from celery_singleton_lock.core.keys import FENCE_TTL_MS
from celery_singleton_lock.core.scripts import pack_holder

LAYOUT1 = Path(__file__).resolve().parent / "support" / "layout1"


def layout1_script(client: LockClient, name: str, *preludes: str) -> Any:
    """The previous release's ``name``.lua, registered as that release registered it."""
    parts = [(LAYOUT1 / f"{part}.lua").read_text() for part in (*preludes, name)]
    return client.redis.register_script(f"local FENCE_TTL_MS = {FENCE_TTL_MS}\n" + "\n".join(parts))


class Layout1:
    """A process of the previous release taking and freeing leases on ``client``'s Redis."""

    def __init__(self, client: LockClient) -> None:
        self.client = client
        self.acquire_script = layout1_script(client, "acquire", "fencing")
        self.release_script = layout1_script(client, "release", "fencing")
        self.release_holder_script = layout1_script(client, "release_holder", "wake_fair_waiter")

    def acquire(
        self, name: str, *, task_id: str = "t-old", ttl_ms: int = 30_000
    ) -> tuple[str, int]:
        """(owner, fencing token) of a hold it took; AssertionError if the name was busy."""
        keys = self.client.connection.keys(name)
        owner = uuid.uuid4().hex
        holder = pack_holder([
            b"name", name, b"kind", b"lease", b"host", HOSTNAME, b"pid", os.getpid(),
            b"thread", b"old-thread", b"heartbeat", 0, b"task_id", task_id,
        ])  # fmt: skip
        taken, token = self.acquire_script(
            keys=[keys.lock, keys.fence], args=[owner, ttl_ms, 0, "", "", 0, holder, ""]
        )
        assert taken == 1, f"{name} is held"
        return owner, int(token)

    def try_acquire(self, name: str) -> bool:
        keys = self.client.connection.keys(name)
        holder = pack_holder([b"name", name, b"kind", b"lease"])
        reply = self.acquire_script(
            keys=[keys.lock, keys.fence], args=[uuid.uuid4().hex, 30_000, 0, "", "", 0, holder, ""]
        )
        return int(reply[0]) == 1

    def release(self, name: str, owner: str) -> int:
        keys = self.client.connection.keys(name)
        return int(self.release_script(keys=[keys.lock], args=[owner, 0]))

    def release_holder(self, name: str, task_id: str) -> int:
        keys = self.client.connection.keys(name)
        args = [task_id, os.getpid(), HOSTNAME, 0, keys.channel]
        return int(self.release_holder_script(keys=[keys.lock], args=args))


def test_a_lease_keeps_its_holder_fields_packed_in_one_field(lock_client: LockClient) -> None:
    lease = lock_client.lease("packed", owner_info={"task_id": "t-1"}, heartbeat=False)
    with lease:
        stored = lock_client.redis.hgetall(lease.keys.lock)
        assert b"task_id" not in stored and b"host" not in stored and b"renewed_ms" not in stored
        assert set(stored) == {b"owner", b"token", b"acquired_ms", b"ttl_ms", PACKED_FIELD}
        fields = flatten(stored)
        assert fields[b"task_id"] == b"t-1" and fields[b"name"] == b"packed"
        assert fields[b"renewed_ms"] == fields[b"acquired_ms"]  # not renewed yet


def test_layout1_hold_is_excluded_listed_cleared_and_released_by_this_release(
    lock_client: LockClient,
) -> None:
    old = Layout1(lock_client)
    old_owner, old_token = old.acquire("shared", task_id="t-7")
    assert not lock_client.lease("shared").acquire(0)  # excluded

    (info,) = lock_client.locks("shared")  # listed with every holder field
    assert (info.name, info.owner, info.token) == ("shared", old_owner, old_token)
    assert (info.task_id, info.host, info.pid, info.thread) == (
        "t-7", HOSTNAME, os.getpid(), "old-thread",
    )  # fmt: skip

    assert lock_client.release_holder("shared", task_id="t-7", pid=os.getpid())
    old.acquire("shared")
    assert lock_client.clear("shared", force=True)
    lease = lock_client.lease("shared", heartbeat=False)
    with lease:
        assert lease.token is not None and lease.token > old_token


def test_this_releases_hold_is_excluded_and_freed_by_layout1_and_tokens_keep_increasing(
    lock_client: LockClient,
) -> None:
    old = Layout1(lock_client)
    tokens = []
    for _ in range(3):
        lease = lock_client.lease("mixed", heartbeat=False)
        assert lease.acquire()
        assert lease.token is not None
        tokens.append(lease.token)
        assert not old.try_acquire("mixed")  # excluded
        assert old.release("mixed", lease.owner or "") == 1  # its owner frees it (a claim)
        owner, token = old.acquire("mixed")
        tokens.append(token)
        assert not lock_client.lease("mixed").acquire(0)
        assert old.release("mixed", owner) == 1
    assert tokens == sorted(set(tokens)), tokens  # strictly increasing across both layouts


def test_layout1_release_holder_leaves_a_layout2_hold_alone(lock_client: LockClient) -> None:
    """What the previous release cannot do with this one's holds: find the task id in them
    (it reads its own fields). Such a hold then runs out by its expiry."""
    old = Layout1(lock_client)
    lease = lock_client.lease("supervised", owner_info={"task_id": "t-3"}, heartbeat=False)
    with lease:
        assert old.release_holder("supervised", "t-3") == 0
        assert lease.held


def test_a_holder_field_that_does_not_unpack_leaves_the_hold_listed(
    lock_client: LockClient,
) -> None:
    lease = lock_client.lease("garbled", heartbeat=False)
    with lease:
        lock_client.redis.hset(lease.keys.lock, PACKED_FIELD, b"\x92\xa4name")  # cut short
        (info,) = lock_client.locks()
        assert (info.owner, info.token, info.name) == (lease.owner, lease.token, "")
        assert unpack_strings_fails(b"\x92\xa4name") and unpack_strings_fails(b"\xc1")


def unpack_strings_fails(raw: bytes) -> bool:
    try:
        unpack_strings(raw)
    except ValueError:
        return True
    return False
