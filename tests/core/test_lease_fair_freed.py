"""A fair waiter gets the name promptly however its holder's lease ends: released, cleared by
an administrator, released by the holder's supervisor, released with a multi-key lock, or run
out after the holder was killed.

A blocked fair waiter refreshes its place only every few hundred ms; these tests stretch that
to seconds, so a waiter that is not woken when the name is freed would miss the bound.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.context import SpawnContext

import pytest
from support.lease_children import holder as holder_process
from support.waiting import BackgroundAcquire, wait_for

from celery_singleton_lock import Lease, LockClient
from celery_singleton_lock.kinds import lease as lease_module

CTX: SpawnContext = multiprocessing.get_context("spawn")
#: How soon a woken waiter must hold the name (its refresh, stretched, is far longer).
PROMPT = 1.0


@pytest.fixture(autouse=True)
def slow_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiters refresh every 5 s (registered for 10 s), so only a wake-up is prompt."""
    monkeypatch.setattr(lease_module, "FAIR_REFRESH", 5.0)
    monkeypatch.setattr(lease_module, "FAIR_REGISTRATION_MS", 10_000)


def queued_waiter(client: LockClient, name: str, ahead: int = 0) -> tuple[Lease, BackgroundAcquire]:
    """A fair waiter blocked behind ``ahead`` others already queued."""
    waiter = client.lease(name, ttl=30, heartbeat=False, fair=True)
    blocked = BackgroundAcquire(waiter, wait=25)
    queue = waiter.keys.base + b"queue"
    wait_for(lambda: client.redis.llen(queue) == ahead + 1, 10, "the waiter to queue")
    wait_for_blpop(client)
    return waiter, blocked


def wait_for_blpop(client: LockClient) -> None:
    """Until a waiter blocks on its hand-off list (after its queued attempt)."""
    wait_for(
        lambda: any(c["cmd"] == "blpop" for c in client.redis.client_list()),
        10,
        "the waiter to block",
    )


def assert_gets_it_promptly(
    client: LockClient, waiter: Lease, blocked: BackgroundAcquire, free: Callable[[], object]
) -> None:
    freed_at = time.monotonic()
    free()
    assert blocked.done.wait(20)
    assert time.monotonic() - freed_at < PROMPT
    assert blocked.results == [True] and not blocked.errors
    assert waiter.held
    waiter.release()
    assert not client.redis.exists(waiter.keys.lock, waiter.keys.base + b"queue")


@pytest.fixture
def holder(lock_client: LockClient) -> Lease:
    lease = lock_client.lease("freed", ttl=30, heartbeat=False, owner_info={"task_id": "t-1"})
    assert lease.acquire()
    return lease


def test_release_hands_it_over(lock_client: LockClient, holder: Lease) -> None:
    waiter, blocked = queued_waiter(lock_client, "freed")
    assert_gets_it_promptly(lock_client, waiter, blocked, holder.release)


@pytest.mark.usefixtures("holder")
def test_admin_clear_wakes_it(lock_client: LockClient) -> None:
    waiter, blocked = queued_waiter(lock_client, "freed")
    assert_gets_it_promptly(
        lock_client, waiter, blocked, lambda: lock_client.clear("freed", force=True)
    )


@pytest.mark.usefixtures("holder")
def test_supervisor_release_holder_wakes_it(lock_client: LockClient) -> None:
    waiter, blocked = queued_waiter(lock_client, "freed")

    def free() -> None:
        assert lock_client.release_holder("freed", task_id="t-1", pid=os.getpid())

    assert_gets_it_promptly(lock_client, waiter, blocked, free)


def test_multi_release_wakes_it(lock_client: LockClient) -> None:
    held = lock_client.multi(["freed", "other"], ttl=30, heartbeat=False)
    assert held.acquire()
    waiter, blocked = queued_waiter(lock_client, "freed")
    assert_gets_it_promptly(lock_client, waiter, blocked, held.release)


def test_dead_waiter_is_skipped_and_the_next_one_woken(
    lock_client: LockClient, holder: Lease
) -> None:
    # Queued, but its registration ran out.
    lock_client.redis.rpush(holder.keys.base + b"queue", "gone")
    waiter, blocked = queued_waiter(lock_client, "freed", ahead=1)
    assert_gets_it_promptly(
        lock_client, waiter, blocked, lambda: lock_client.clear("freed", force=True)
    )


@pytest.mark.timeout(60)
def test_sigkilled_holder_its_lease_runs_out(lock_client: LockClient, lock_redis_url: str) -> None:
    ttl = 1.0
    ours, theirs = CTX.Pipe()
    process = CTX.Process(
        target=holder_process,
        args=(lock_redis_url, lock_client.prefix, "freed", ttl, theirs),
        daemon=True,
    )
    process.start()
    try:
        assert ours.poll(30) and ours.recv()[0] == "acquired"
        waiter, blocked = queued_waiter(lock_client, "freed")
        killed_at = time.monotonic()
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.join(10)
    assert blocked.done.wait(20)
    # Nobody frees it: the waiter looks again at the dead holder's expiry (its hint).
    assert time.monotonic() - killed_at < ttl + PROMPT
    assert blocked.results == [True] and waiter.held
    waiter.release()
