"""A message that comes back while the run it copies still holds the lock, with real
``celery worker`` processes (tests/apps/fault_app.py: ``acks_late``, ``reject_on_worker_lost``
and a visibility timeout shorter than the task's lease, on the Redis transport).

A whole worker is SIGKILLed mid-run, children and all: its message comes back while the dead
run's lease still stands. The call must still run, and never beside another run of its key.
A message delivered again while its first delivery still waits for the lock must not run the
body a second time once that delivery ran. Nor may one delivered again while its first
delivery runs under a read hold, which other calls share.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apps.fault_app import gate_key
from support.chaos import Workers
from support.waiting import wait_for

from celery_singleton_lock.celery import waiting_marks
from celery_singleton_lock.embedded import RedisServer

TIMEOUT = 60.0
#: fault.gated's lease: the dead run's hold would stand this long.
LEASE = 30.0


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Workers]:
    with RedisServer() as broker, RedisServer() as lock:
        workers = Workers(lock.url, broker.url, f"csltest:redeliver:{broker.port}:", tmp_path)
        try:
            yield workers
        finally:
            workers.close()


def events(pool: Workers, **match: Any) -> list[dict[str, Any]]:
    return [e for e in pool.events() if all(e.get(k) == v for k, v in match.items())]


def now(pool: Workers) -> float:
    seconds, micros = pool.broker.time()
    return int(seconds) + int(micros) / 1_000_000


def open_gate(pool: Workers, key: str) -> None:
    pool.broker.set(gate_key(pool.prefix, key), 1, ex=600)


@pytest.mark.timeout(180)
def test_killed_worker_message_comes_back_to_its_node_and_runs_at_once(pool: Workers) -> None:
    node = f"redeliver-{pool.tag}@localhost"
    first_worker = pool.start(concurrency=1, name=node)
    pool.wait_ready(first_worker)
    result = pool.app.tasks["fault.gated"].apply_async(("k1", TIMEOUT))
    first = wait_for(lambda: events(pool, event="start", task_id=result.id), TIMEOUT, "a run")
    first_worker.kill()
    killed_at = now(pool)
    # The same node restarted: the dead run's process is gone, so the worker frees its hold
    # as it starts and the message that comes back (visibility timeout) runs at once, not
    # once the lease runs out.
    second_worker = pool.start(concurrency=1, name=node)
    pool.wait_ready(second_worker)
    starts = wait_for(
        lambda: events(pool, event="start", task_id=result.id)[1:], TIMEOUT, "the copy to run"
    )
    open_gate(pool, "k1")
    outcome = result.get(timeout=TIMEOUT)
    assert result.state == "SUCCESS" and outcome["locked"], outcome
    copy = starts[0]
    assert copy["pid"] != first[0]["pid"] and copy["time"] > killed_at  # never beside it
    # Freed from the dead process, not run once the lease ran out.
    assert copy["time"] - killed_at < LEASE, (copy, killed_at)
    assert "left by a previous life of worker" in second_worker.log_tail(200)
    assert len(events(pool, event="start", task_id=result.id)) == 2
    assert len(events(pool, event="end", task_id=result.id)) == 1


@pytest.mark.timeout(180)
def test_copy_of_a_live_run_waits_in_the_queue_and_runs_once_the_original_dies(
    pool: Workers,
) -> None:
    workers = [pool.start(concurrency=1), pool.start(concurrency=1)]
    pool.wait_ready(*workers)
    task = pool.app.tasks["fault.gated"]
    result = task.apply_async(("k2", TIMEOUT))
    first = wait_for(lambda: events(pool, event="start", task_id=result.id), TIMEOUT, "a run")
    original_worker = next(w for w in workers if first[0]["pid"] in w.children())
    other_worker = next(w for w in workers if w is not original_worker)
    # A copy of the message, on the other node (the busy one takes no more: prefetch 1,
    # acks_late), while the original runs and renews its lease.
    pool.app.send_task(task.name, ("k2", TIMEOUT), task_id=result.id)
    wait_for(
        lambda: "re-queued: a live copy of this task id" in other_worker.log_tail(200),
        TIMEOUT,
        "the copy to be re-queued",
    )
    assert len(events(pool, event="start", task_id=result.id)) == 1
    assert result.state == "PENDING"  # the copy stored nothing
    original_worker.kill()
    killed_at = now(pool)
    starts = wait_for(
        lambda: events(pool, event="start", task_id=result.id)[1:], TIMEOUT, "the copy to run"
    )
    open_gate(pool, "k2")
    assert result.get(timeout=TIMEOUT)["locked"]
    assert starts[0]["pid"] != first[0]["pid"] and starts[0]["time"] > killed_at
    # The original's own message came back too (acks_late): it is re-queued behind the run,
    # then dropped once that run's result is in; the call ran once more, never twice at once.
    wait_for(
        lambda: "dropped: the original run ended (SUCCESS)" in other_worker.log_tail(400),
        TIMEOUT,
        "the other copy to be dropped",
    )
    runs = events(pool, event="start", task_id=result.id)
    ends = events(pool, event="end", task_id=result.id)
    assert len(runs) == 2 and len(ends) == 1, (runs, ends)


@pytest.mark.timeout(180)
def test_copy_of_a_delivery_waiting_for_the_lock_is_requeued_and_dropped_not_run_again(
    pool: Workers,
) -> None:
    workers = [pool.start(concurrency=1), pool.start(concurrency=1)]
    pool.wait_ready(*workers)
    # fault.chaos: acks_late, lock_wait=15 s.
    task = pool.app.tasks["fault.chaos"]
    args = ("kw", 0.3)
    # Another call holds the key, so the call's first delivery waits for it.
    blocker = task.make_lock(args, owner_info={"task_name": "blocker", "task_id": "blocker"})
    assert blocker.acquire(0.0)
    lock = task.lock_client.connection
    try:
        result = task.apply_async(args)
        received = wait_for(
            lambda: events(pool, event="received", task_id=result.id), TIMEOUT, "a delivery"
        )
        lock_hash = lock.keys(blocker.name).lock
        wait_for(lambda: lock.redis.hget(lock_hash, "waiting"), TIMEOUT, "it to wait")
        original_worker = next(w for w in workers if received[0]["pid"] in w.children())
        other_worker = next(w for w in workers if w is not original_worker)
        # A second delivery of the same message (as a visibility timeout would make) while
        # the first still waits: it must not wait behind it and then run the body again.
        pool.app.send_task(task.name, args, task_id=result.id)
        wait_for(
            lambda: (
                "re-queued: a copy of this task id waits for the lock" in other_worker.log_tail(200)
            ),
            TIMEOUT,
            "the copy to be re-queued",
        )
        mark = waiting_marks.mark_key(lock, blocker, result.id, 0)
        assert 0 < lock.redis.pttl(mark) <= (15 + waiting_marks.MARK_MARGIN_S) * 1000
        assert result.state == "PENDING"  # the copy stored nothing
    finally:
        blocker.release()
    assert result.get(timeout=TIMEOUT) > 0
    assert result.state == "SUCCESS"
    wait_for(
        lambda: any(
            "dropped: the original run ended (SUCCESS)" in w.log_tail(400) for w in workers
        ),
        TIMEOUT,
        "the copy to be dropped",
    )
    assert len(events(pool, event="start", task_id=result.id)) == 1
    assert len(events(pool, event="end", task_id=result.id)) == 1
    assert not lock.redis.exists(mark)  # removed when the wait ended


@pytest.mark.timeout(180)
def test_message_delivered_again_beside_its_running_read_hold_is_requeued_not_run(
    pool: Workers,
) -> None:
    worker = pool.start(concurrency=2)  # room for the copy beside the run
    pool.wait_ready(worker)
    result = pool.app.tasks["fault.gated_read"].apply_async(("k4", TIMEOUT))
    wait_for(lambda: events(pool, event="start", task_id=result.id), TIMEOUT, "a run")
    # The run outlasts the broker's visibility timeout (8 s, acks_late): the broker delivers
    # its message again while it runs. A read hold would share with the copy's.
    wait_for(
        lambda: (
            "re-queued: a hold of this task id stands" in worker.log_tail(200)
            or len(events(pool, event="start", task_id=result.id)) > 1
        ),
        TIMEOUT,
        "the broker's copy to be dealt with",
    )
    assert len(events(pool, event="start", task_id=result.id)) == 1
    open_gate(pool, "k4")
    assert result.get(timeout=TIMEOUT)["locked"]
    assert result.state == "SUCCESS"
    assert len(events(pool, event="start", task_id=result.id)) == 1
    assert len(events(pool, event="end", task_id=result.id)) == 1
