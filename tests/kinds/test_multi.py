"""Multi-key locks: all or nothing, shared keys with leases, no deadlock across processes."""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any

import pytest
from support.kind_children import multi_worker

from celery_singleton_lock import ConfigurationError, LockClient, LockTaken, MultiLease
from celery_singleton_lock.kinds import multi


def test_all_or_nothing(lock_client: LockClient) -> None:
    lease_b = lock_client.lease("b")
    assert lease_b.acquire()
    both = lock_client.multi(["a", "b"])
    assert not both.acquire()
    lease_a = lock_client.lease("a")
    assert lease_a.acquire()  # nothing of the refused multi was left behind
    lease_a.release()
    lease_b.release()
    assert both.acquire()
    assert both.held
    assert not lock_client.lease("a").acquire()
    assert not lock_client.lease("b").acquire()
    assert not lock_client.multi(["b", "c"]).acquire()
    assert lock_client.lease("c").acquire()
    both.release()
    assert lock_client.lease("a").acquire()


def test_tokens_per_name(lock_client: LockClient) -> None:
    with lock_client.lease("x") as lease:
        before = lease.token
    with lock_client.multi(["y", "x"]) as held:
        assert set(held.tokens) == {"x", "y"}
        assert held.token == max(held.tokens.values())
        assert held.names == ("x", "y")
    with lock_client.lease("x") as lease:
        after = lease.token
    assert before is not None and after is not None
    assert before < held.tokens["x"] < after


def test_waiting_multi_wakes_when_the_last_name_is_released(lock_client: LockClient) -> None:
    lease_a, lease_b = lock_client.lease("a", ttl=30), lock_client.lease("b", ttl=30)
    assert lease_a.acquire() and lease_b.acquire()
    got = threading.Event()
    handle = lock_client.multi(["a", "b"], wait=20)
    thread = threading.Thread(target=lambda: handle.acquire() and got.set())
    thread.start()
    lease_a.release()
    assert not got.wait(0.3)
    released = time.monotonic()
    lease_b.release()
    assert got.wait(10)
    assert time.monotonic() - released < 1.0  # woken by the release, not the 30 s lease
    thread.join()
    handle.release()


def test_lease_waiter_wakes_when_a_multi_releases(lock_client: LockClient) -> None:
    held = lock_client.multi(["p", "q"])
    assert held.acquire()
    waiter = lock_client.lease("q", wait=20)
    got = threading.Event()
    thread = threading.Thread(target=lambda: waiter.acquire() and got.set())
    thread.start()
    time.sleep(0.2)  # let it block (nothing to await: it is inside acquire)
    released = time.monotonic()
    held.release()
    assert got.wait(10)
    assert time.monotonic() - released < 1.0
    thread.join()
    waiter.release()


@pytest.mark.timeout(90)
def test_overlapping_multis_from_processes_never_deadlock(
    lock_client: LockClient, lock_redis_url: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    sets = [["a", "b"], ["b", "c"], ["c", "a"], ["a", "b", "c"]]
    rounds = 15
    go = ctx.Event()
    workers = []
    for names in sets:
        ours, theirs = ctx.Pipe()
        process = ctx.Process(
            target=multi_worker,
            args=(lock_redis_url, lock_client.prefix, names, rounds, go, theirs),
            daemon=True,
        )
        process.start()
        workers.append((process, ours))
    try:
        go.set()
        results: list[dict[str, list[int]]] = []
        for _, conn in workers:
            assert conn.poll(80), "a worker did not finish: deadlock or starvation"
            results.append(conn.recv())
    finally:
        for process, _ in workers:
            process.kill()
            process.join(10)
    for name in "abc":
        expected = sum(rounds for names in sets if name in names)
        assert int(lock_client.redis.get(f"{lock_client.prefix}count:{name}")) == expected
        tokens = [t for seen in results for t in seen.get(name, [])]
        assert len(set(tokens)) == len(tokens) == expected  # one token per acquisition


def test_heartbeat_renews_a_multi_and_extend_sets(lock_client: LockClient) -> None:
    held = lock_client.multi(["h1", "h2"], ttl=0.3)
    assert held.acquire()
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline:
        held.check()
        time.sleep(0.05)
    assert held.extend(5) == pytest.approx(5.0)
    assert all(lock_client.redis.pttl(k.lock) <= 5000 for k in held.keys)
    held.release()


def test_lost_name_is_reported(lock_client: LockClient) -> None:
    held = lock_client.multi(["l1", "l2"], heartbeat=False)
    assert held.acquire()
    [record] = multi.list_holders(lock_client, "l2")
    assert record["kind"] == "multi" and record["owner"] == held.owner
    assert record["token"] == held.tokens["l2"] and record["names"] == "2"
    assert not multi.clear_holder(lock_client, "l2", held.owner or "", token=1)
    assert multi.clear_holder(lock_client, "l2", held.owner or "", token=held.tokens["l2"])
    assert lock_client.lease("l2").acquire()
    assert lock_client.lease("l1").acquire(wait=0) is False
    with pytest.raises(LockTaken):  # l2 has another owner now
        held.extend()
    assert held.lost


@pytest.mark.parametrize(
    ("names", "options", "argument"),
    [
        ("ab", {}, "names"),
        ([], {}, "names"),
        (["a", ""], {}, "names"),
        (["a", 3], {}, "names"),
        (["a"], {"ttl": -1}, "ttl"),
        (["a"], {"wait": float("nan")}, "wait"),
    ],
)
def test_bad_arguments(names: Any, options: dict[str, Any], argument: str) -> None:
    client = LockClient.from_url("redis://127.0.0.1:1/0")  # nothing listens there
    with pytest.raises(ConfigurationError) as info:
        client.multi(names, **options)
    assert info.value.argument == argument


def test_is_exported() -> None:
    assert MultiLease.kind == "multi"
