"""celery/waiting_marks.py on a real Redis: the mark a delivery leaves while it waits for its
lock, how a copy of the same message meets it, and how a dead delivery's mark is freed."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
import redis
from celery import Celery
from redis.backoff import NoBackoff
from redis.retry import Retry
from support.proxies import HoldingProxy
from support.waiting import wait_for

from celery_singleton_lock import Lease, LockClient, MultiLease, SingletonTask, is_skipped
from celery_singleton_lock.celery import own_holds
from celery_singleton_lock.celery.waiting_marks import (
    MARK_LONGEST_WAIT_S,
    MARK_MARGIN_S,
    CopyOfWaiting,
    Mark,
    claim,
    mark_key,
    remove,
    requeue_countdown,
    scripts,
)
from celery_singleton_lock.core.connection import Connection
from celery_singleton_lock.core.holder import HOSTNAME
from celery_singleton_lock.core.keys import key_base
from celery_singleton_lock.core.pid_evidence import ProcessMark, this_process_text

NODE = "celery@here"
#: A process that prints its pid and its process mark, and exits.
MARK_OF_CHILD = (
    "from celery_singleton_lock.core.pid_evidence import this_process_text\n"
    "import os; print(os.getpid(), this_process_text())"
)

WorkerFactory = Callable[..., AbstractContextManager[Any]]


@pytest.fixture
def connection(lock_redis_url: str, lock_prefix: str) -> Iterator[Connection]:
    client = LockClient.from_url(lock_redis_url, prefix=lock_prefix)
    yield client.connection
    client.close()


def claim_mark(connection: Connection, key: bytes, node: str = NODE, requeues: int = 0) -> Mark:
    return claim(connection, key, wait=10.0, node=node, requeues=requeues, max_countdown=None)


def test_a_waiting_delivery_marks_its_wait_with_an_expiry_and_removes_the_mark(
    connection: Connection,
) -> None:
    key = mark_key(connection, Lease(connection, "job:1"), "t-1", 0)
    assert key == connection.keys("job:1").base + b"waiting:t-1:0"
    mark = claim_mark(connection, key)
    assert connection.redis.get(key).decode() == mark.value
    node, pid, host, _nonce, proc = mark.value.split("|")
    assert (node, host) == (NODE, HOSTNAME) and int(pid) > 0
    assert proc == this_process_text()
    assert 10_000 < connection.redis.pttl(key) <= (10 + MARK_MARGIN_S) * 1000
    remove(connection, mark)
    assert not connection.redis.exists(key)


def test_a_copy_meeting_the_mark_of_a_live_delivery_is_told_to_requeue(
    connection: Connection,
) -> None:
    key = mark_key(connection, Lease(connection, "job:2"), "t-2", 0)
    original = claim_mark(connection, key, node="celery@there")
    with pytest.raises(CopyOfWaiting) as raised:
        claim_mark(connection, key, requeues=2)
    verdict = raised.value.verdict()
    assert verdict.action == own_holds.REQUEUE and "celery@there" in verdict.why
    assert verdict.countdown == 4 * own_holds.MARGIN_S
    # The copy left the original's mark alone; a removal by another owner does nothing.
    assert connection.redis.get(key).decode() == original.value
    remove(connection, Mark(key, "someone|1|else|x"))
    assert connection.redis.get(key).decode() == original.value
    remove(connection, original)


def test_the_mark_of_a_delivery_whose_process_is_gone_is_taken_over_on_its_node(
    connection: Connection,
) -> None:
    gone = subprocess.run([sys.executable, "-c", MARK_OF_CHILD], check=True,
                          capture_output=True, text=True)  # fmt: skip
    dead_pid, proc = gone.stdout.split()
    key = mark_key(connection, Lease(connection, "job:3"), "t-3", 0)
    dead = f"{NODE}|{dead_pid}|{HOSTNAME}|n0|{proc}"
    connection.redis.set(key, dead, px=60_000)
    # Another node cannot tell whether that process lives: it re-queues.
    with pytest.raises(CopyOfWaiting):
        claim_mark(connection, key, node="celery@elsewhere")
    # Nor can this node from a mark that does not say where and when the pid was taken (an
    # older version's), nor from one of another pid namespace (another container).
    recorded = ProcessMark.parse(proc)
    assert recorded is not None
    elsewhere = dataclasses.replace(recorded, pid_ns=recorded.pid_ns + 1).text()
    for unproven in (
        f"{NODE}|{dead_pid}|{HOSTNAME}|n0",
        f"{NODE}|{dead_pid}|{HOSTNAME}|n0|{elsewhere}",
    ):
        connection.redis.set(key, unproven, px=60_000)
        with pytest.raises(CopyOfWaiting):
            claim_mark(connection, key)
    connection.redis.set(key, dead, px=60_000)
    mark = claim_mark(connection, key)
    assert connection.redis.get(key).decode() == mark.value != dead
    assert connection.redis.pttl(key) <= (10 + MARK_MARGIN_S) * 1000
    remove(connection, mark)
    assert not connection.redis.exists(key)


def test_a_multi_key_lock_marks_its_wait_in_its_first_names_slot(connection: Connection) -> None:
    multi = MultiLease(connection, ["b:2", "a:1"])
    key = mark_key(connection, multi, "t-4", 1)
    assert key == key_base(connection.keys(multi.names[0]).lock) + b"waiting:t-4:1"


@pytest.mark.parametrize(
    ("remaining", "requeues", "cap", "expected"),
    [(10.0, 0, None, 1.0), (10.0, 2, None, 4.0), (10.0, 9, None, 11.0), (10.0, 9, 4.0, 4.0),
     (0.5, 5, None, 1.5), (0.0, 0, None, 1.0)],
)  # fmt: skip
def test_a_copy_stays_away_longer_each_time_but_not_past_the_mark_nor_the_cap(
    remaining: float, requeues: int, cap: float | None, expected: float
) -> None:
    assert requeue_countdown(remaining, requeues, cap) == expected


def test_a_run_that_gives_up_waiting_removes_its_mark(
    celery_lock_app: Celery, in_process_worker: WorkerFactory
) -> None:
    @celery_lock_app.task(
        base=SingletonTask, shared=False, lock_key="job:{key}", lock_wait=3, lock_conflict="skip"
    )  # fmt: skip
    def job(key: str) -> str:
        return key

    blocker = job.make_lock(("w",), owner_info={"task_id": "blocker"})
    assert blocker.acquire(0.0)
    connection = job.lock_client.connection
    try:
        with in_process_worker(celery_lock_app, concurrency=1):
            result = job.delay("w")
            key = mark_key(connection, blocker, result.id, 0)
            # While it waits, its mark stands, with an expiry.
            wait_for(lambda: connection.redis.exists(key), 30.0, "the wait mark")
            assert 0 < connection.redis.pttl(key) <= (3 + MARK_MARGIN_S) * 1000
            assert is_skipped(result.get(timeout=30))
    finally:
        blocker.release()
    assert not connection.redis.exists(key)


def test_a_wait_without_end_is_marked_for_the_longest_wait_a_mark_covers(
    connection: Connection,
) -> None:
    """``lock_wait=math.inf``: the mark still has an expiry (nothing renews it)."""
    key = mark_key(connection, Lease(connection, "job:inf"), "t-inf", 0)
    mark = claim(connection, key, wait=math.inf, node=NODE, requeues=0, max_countdown=None)
    try:
        pttl = connection.redis.pttl(key)
        assert 0 < pttl <= (MARK_LONGEST_WAIT_S + MARK_MARGIN_S) * 1000
    finally:
        remove(connection, mark)
    assert connection.redis.exists(key) == 0


def test_a_claim_sent_again_after_its_reply_was_lost_holds_the_mark(
    connection: Connection,
) -> None:
    """The claim ran, its reply was lost, redis-py's retry sent it again: the second send
    finds the mark the first one set, and that is this delivery's mark, not a copy's."""
    port = int(connection.redis.connection_pool.connection_kwargs["port"])
    proxy = HoldingProxy(port)
    via = redis.Redis(port=proxy.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 1))
    client = LockClient(via, prefix=connection.prefix)
    try:
        key = mark_key(client.connection, Lease(client.connection, "job:resent"), "t-r", 0)
        client.connection.call(via.ping)  # a connection open: the next reply is the claim's
        scripts(client.connection).claim.sha = via.script_load(
            scripts(client.connection).claim.script
        )
        proxy.hold_next_reply()
        mark = claim(client.connection, key, wait=10.0, node=NODE, requeues=0, max_countdown=None)
        assert proxy.holding.is_set()
        assert connection.redis.get(key) == mark.value.encode()
        remove(client.connection, mark)
        assert connection.redis.exists(key) == 0
    finally:
        client.close()
        proxy.close()
