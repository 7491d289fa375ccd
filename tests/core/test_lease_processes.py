"""Exclusive lease across real processes: mutual exclusion, fencing, crashes and pauses."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

import pytest
from support.lease_children import counter_worker, cpu_holder, fenced_write, holder
from support.waiting import wait_for_subscriber

from celery_singleton_lock import LockClient

CTX: SpawnContext = multiprocessing.get_context("spawn")


@pytest.fixture
def processes() -> Iterator[list[SpawnProcess]]:
    """Processes started by a test; whatever is left is killed at the end."""
    started: list[SpawnProcess] = []
    yield started
    for process in started:
        if process.is_alive():
            os.kill(process.pid, signal.SIGCONT)
            process.kill()
        process.join(10)


def start(
    processes: list[SpawnProcess], target: Any, *args: Any
) -> tuple[SpawnProcess, Connection]:
    ours, theirs = CTX.Pipe()
    process = CTX.Process(target=target, args=(*args, theirs), daemon=True)
    process.start()
    processes.append(process)
    return process, ours


def receive(conn: Connection, timeout: float = 30.0) -> Any:
    assert conn.poll(timeout), "worker did not answer in time"
    return conn.recv()


@pytest.mark.timeout(60)
def test_mutual_exclusion_and_fencing_across_processes(
    lock_client: LockClient, lock_redis_url: str, processes: list[SpawnProcess]
) -> None:
    workers, iterations = 4, 25
    go = CTX.Event()
    conns = [
        start(processes, counter_worker, lock_redis_url, lock_client.prefix, iterations, go)[1]
        for _ in range(workers)
    ]
    go.set()
    seen: list[tuple[int, int]] = []
    for conn in conns:
        seen += receive(conn, 50)
    for process in processes:
        process.join(10)
        assert process.exitcode == 0

    # No lost update: every read-modify-write saw the previous one's result.
    assert int(lock_client.redis.get(lock_client.prefix + "counter-value")) == workers * iterations
    values = sorted(value for value, _ in seen)
    assert values == list(range(workers * iterations))
    # Fencing tokens are unique and increase in acquisition order (the value each holder read).
    tokens_in_order = [token for _, token in sorted(seen)]
    assert len(set(tokens_in_order)) == len(tokens_in_order)
    assert tokens_in_order == sorted(tokens_in_order), tokens_in_order


@pytest.mark.timeout(60)
def test_sigkilled_holder_frees_the_name_within_its_ttl(
    lock_client: LockClient, lock_redis_url: str, processes: list[SpawnProcess]
) -> None:
    ttl = 1.0
    process, conn = start(processes, holder, lock_redis_url, lock_client.prefix, "victim", ttl)
    assert receive(conn)[0] == "acquired"

    waiter = lock_client.lease("victim", ttl=10)
    acquired_at: list[float] = []
    outcome: list[bool] = []

    def wait_for_it() -> None:
        outcome.append(waiter.acquire(wait=15))
        acquired_at.append(time.monotonic())

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    wait_for_subscriber(lock_client, waiter.keys.channel)
    killed_at = time.monotonic()
    os.kill(process.pid, signal.SIGKILL)
    thread.join(15)
    assert outcome == [True]
    # Nobody released: the waiter was woken by its hint at the dead holder's expiry.
    assert acquired_at[0] - killed_at < ttl + 1.5
    process.join(5)
    assert process.exitcode == -signal.SIGKILL
    assert waiter.held
    waiter.release()


@pytest.mark.timeout(60)
def test_paused_holder_loses_the_lease_and_its_late_write_is_fenced_off(
    lock_client: LockClient, lock_redis_url: str, processes: list[SpawnProcess]
) -> None:
    ttl = 1.0
    store = lock_client.prefix + "store"
    process, conn = start(processes, holder, lock_redis_url, lock_client.prefix, "paused", ttl)
    status, old_token = receive(conn)
    assert status == "acquired"
    # The holder may write while it holds the lease.
    assert fenced_write(lock_client, store, old_token, "value", "holder-early")

    os.kill(process.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        successor = lock_client.lease("paused", ttl=10)
        assert successor.acquire(wait=ttl + 5)
        assert time.monotonic() - stopped_at < ttl + 1.5
        assert successor.token is not None and successor.token > old_token
        assert fenced_write(lock_client, store, successor.token, "value", "successor")
    finally:
        os.kill(process.pid, signal.SIGCONT)

    conn.send(("write", store, "holder-late"))
    report = receive(conn)
    assert report["lost"] is True
    assert report["check"] in ("LockExpired", "LockTaken")
    assert report["accepted"] is False
    assert lock_client.redis.hget(store, "value") == b"successor"
    assert int(lock_client.redis.hget(store, "fence_token")) == successor.token
    # The resumed process's heartbeat never took the name back.
    successor.check()
    assert lock_client.redis.hget(successor.keys.lock, "owner") == successor.owner.encode()
    successor.release()


@pytest.mark.timeout(60)
def test_heartbeat_keeps_a_short_lease_alive_through_cpu_bound_work(
    lock_client: LockClient, lock_redis_url: str, processes: list[SpawnProcess]
) -> None:
    # Six ttls. The ttl is short enough that a heartbeat starved by the GIL would lose it,
    # and long enough that a loaded 2-core machine (CI runs six test workers) scheduling the
    # child late does not (0.5 s did, now and then).
    ttl, seconds = 1.5, 9.0
    process, conn = start(
        processes, cpu_holder, lock_redis_url, lock_client.prefix, "busy", ttl, seconds
    )
    status, token = receive(conn)
    assert status == "acquired"
    other = lock_client.lease("busy")
    lock_key = other.keys.lock
    checks = 0
    # Until the worker reports, look from outside: held all along, by the same acquisition.
    while not conn.poll(0.1):
        if lock_client.redis.hget(lock_key, "owner") is None:
            # The worker may have just released after spinning; it has then answered.
            assert conn.poll(1.0), "the lease vanished while the worker was still spinning"
            break
        assert int(lock_client.redis.hget(lock_key, "token")) == token
        assert not other.acquire()
        checks += 1
    report = receive(conn)
    assert report["held"] is True
    assert report["check"] == "ok"
    assert report["ticks"] >= seconds / ttl  # the tick period is ttl / 3: about 3x this
    assert checks >= 10
    process.join(10)
    assert process.exitcode == 0
