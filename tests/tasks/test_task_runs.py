"""SingletonTask runs on a real in-process worker (threads pool) and eagerly."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from support.lost_lock import task_losing_its_lock

from celery_singleton_lock import (
    DuplicateTask,
    LockBackendError,
    LockClient,
    LockLost,
    LockTimeout,
    SingletonTask,
    is_skipped,
    lock_acquired,
    lock_released,
    lock_skipped,
)
from celery_singleton_lock.celery.testing import TaskLocks
from celery_singleton_lock.embedded import free_port

WorkerFactory = Callable[..., AbstractContextManager[Any]]

TIMEOUT = 30


def test_duplicate_is_skipped_while_the_first_runs(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    started, finish = threading.Event(), threading.Event()

    @celery_lock_app.task(base=SingletonTask, shared=False, bind=True, lock_lease=2)
    def job(self: Any, customer: int) -> int:
        started.set()
        assert finish.wait(TIMEOUT)
        assert self.lock is not None and self.lock.held
        return int(self.lock.token)

    skipped: list[str] = []

    def on_skip(sender: Any, name: str, **_: Any) -> None:
        skipped.append(name)

    lock_skipped.connect(on_skip, weak=False)
    try:
        with in_process_worker(celery_lock_app):
            first = job.delay(1)
            assert started.wait(TIMEOUT)
            duplicate = job.delay(customer=1)
            task_locks.assert_skipped(duplicate)
            other_customer = job.delay(2)  # another key runs at once
            finish.set()
            token = task_locks.assert_ran(first)
            assert task_locks.assert_ran(other_customer) != token
            assert task_locks.assert_ran(job.delay(1)) > token  # free again afterwards
    finally:
        lock_skipped.disconnect(on_skip)
    assert skipped == [job.lock_name((1,), {})]
    value = duplicate.get(timeout=TIMEOUT)
    assert value["holder_task_id"] == first.id


def test_signals_for_acquire_and_release(celery_lock_app: Celery, task_locks: TaskLocks) -> None:
    events: list[str] = []

    @celery_lock_app.task(base=SingletonTask, shared=False)
    def job() -> str:
        events.append("body")
        return "done"

    def acquired(**_: Any) -> None:
        events.append("acquired")

    def released(**_: Any) -> None:
        events.append("released")

    lock_acquired.connect(acquired, sender=job, weak=False)
    lock_released.connect(released, sender=job, weak=False)
    try:
        assert task_locks.assert_ran(job.apply()) == "done"
    finally:
        lock_acquired.disconnect(acquired, sender=job)
        lock_released.disconnect(released, sender=job)
    assert events == ["acquired", "body", "released"]
    assert not task_locks.is_held(job)


def test_eager_apply_takes_the_lock(celery_lock_app: Celery, task_locks: TaskLocks) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False)
    def report(day: str) -> str:
        return day

    with task_locks.hold(report, "2026-11-22"):
        task_locks.assert_skipped(report.apply(args=["2026-11-22"]))
        assert task_locks.assert_ran(report.apply(args=["2026-11-23"])) == "2026-11-23"
    assert task_locks.assert_ran(report.apply(kwargs={"day": "2026-11-22"})) == "2026-11-22"


def test_direct_call_is_not_locked(celery_lock_app: Celery, task_locks: TaskLocks) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False)
    def add(a: int, b: int) -> int:
        return a + b

    with task_locks.hold(add, 1, 2):
        assert add(1, 2) == 3


def test_conflict_raise_fails_the_run(celery_lock_app: Celery, task_locks: TaskLocks) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_conflict="raise")
    def job() -> None: ...

    with task_locks.hold(job), pytest.raises(LockTimeout):
        job.apply().get(timeout=TIMEOUT)


def test_conflict_retry_runs_once_the_lock_is_free(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    attempts: list[int] = []

    @celery_lock_app.task(
        base=SingletonTask, shared=False, bind=True, lock_conflict="retry", lock_retry_countdown=0.2
    )
    def job(self: Any) -> int:
        attempts.append(self.request.retries)
        return int(self.request.retries)

    skipped_retries = threading.Event()

    def on_retry(**_: Any) -> None:
        skipped_retries.set()

    from celery.signals import task_retry

    task_retry.connect(on_retry, weak=False)
    try:
        with in_process_worker(celery_lock_app):
            with task_locks.hold(job):
                result = job.delay()
                assert skipped_retries.wait(TIMEOUT)  # the run found the lock taken
            retries = result.get(timeout=TIMEOUT)
    finally:
        task_retry.disconnect(on_retry)
    assert retries >= 1
    assert attempts == [retries]  # the body ran once, on the retry that got the lock


def test_wait_for_the_lock(celery_lock_app: Celery, task_locks: TaskLocks) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_wait=10)
    def job() -> str:
        return "ran"

    held = job.lock_client.lease(job.lock_name())
    assert held.acquire()
    threading.Timer(0.3, held.release).start()
    started = time.monotonic()
    assert task_locks.assert_ran(job.apply()) == "ran"
    assert 0.25 < time.monotonic() - started < 5


def test_release_delay_keeps_the_key_locked(celery_lock_app: Celery, task_locks: TaskLocks) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_release_delay=1.0)
    def hourly() -> str:
        return "ran"

    assert task_locks.assert_ran(hourly.apply()) == "ran"
    ended = time.monotonic()
    assert task_locks.is_held(hourly)
    task_locks.assert_skipped(hourly.apply())
    client = hourly.lock_client
    lease = client.lease(hourly.lock_name())
    assert lease.acquire(wait=5)  # woken at the delay's end
    assert time.monotonic() - ended >= 0.9
    lease.release()


def test_retry_hands_the_lock_to_the_retried_run(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    retried = threading.Event()

    @celery_lock_app.task(base=SingletonTask, shared=False, bind=True, max_retries=3)
    def flaky(self: Any) -> int:
        if self.request.retries == 0:
            retried.set()
            raise self.retry(countdown=1.0)
        return int(self.request.retries)

    with in_process_worker(celery_lock_app):
        result = flaky.delay()
        assert retried.wait(TIMEOUT)
        # Between the retry and its rerun the key stays locked: a duplicate is skipped...
        task_locks.assert_skipped(flaky.delay())
        # ...and the retried run itself is not.
        assert result.get(timeout=TIMEOUT) == 1
    assert not task_locks.is_held(flaky)


def test_retry_past_max_retries_frees_the_key(
    celery_lock_app: Celery, task_locks: TaskLocks
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, bind=True, max_retries=0)
    def doomed(self: Any) -> None:
        raise self.retry(countdown=60, exc=RuntimeError("no luck"))

    with pytest.raises(RuntimeError):
        doomed.apply().get(timeout=TIMEOUT)
    assert not task_locks.is_held(doomed)


def test_on_enqueue_returns_the_queued_call(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_on_enqueue=True)
    def sync(customer: int) -> int:
        return customer

    first = sync.apply_async((5,), countdown=1)
    again = sync.delay(customer=5)
    assert again.id == first.id
    assert sync.delay(6).id != first.id
    with in_process_worker(celery_lock_app):
        assert task_locks.assert_ran(first) == 5  # the worker took the claim over
    assert not task_locks.is_held(sync, 5)
    assert sync.apply_async((5,), countdown=30).id != first.id


def test_on_enqueue_raise(celery_lock_app: Celery) -> None:
    @celery_lock_app.task(
        base=SingletonTask, shared=False, lock_on_enqueue=True, lock_conflict="raise"
    )
    def sync(customer: int) -> int:
        return customer

    first = sync.apply_async((5,), queue="nobody-consumes-this")
    with pytest.raises(DuplicateTask) as info:
        sync.delay(5)
    assert info.value.task_id == first.id


def test_on_enqueue_claim_expires_if_never_run(
    celery_lock_app: Celery, task_locks: TaskLocks
) -> None:
    @celery_lock_app.task(
        base=SingletonTask, shared=False, lock_on_enqueue=True, lock_queue_ttl=0.5
    )
    def sync(customer: int) -> int:
        return customer

    first = sync.apply_async((5,), queue="nobody-consumes-this")
    assert task_locks.is_held(sync, 5)
    lease = sync.lock_client.lease(sync.lock_name((5,)))
    assert lease.acquire(wait=5)  # free once the claim ran out
    lease.release()
    assert sync.apply_async((5,), queue="nobody-consumes-this").id != first.id


def test_redelivered_message_does_not_take_the_lock_of_its_first_copy(
    celery_lock_app: Celery, task_locks: TaskLocks
) -> None:
    inside = threading.Event()
    leave = threading.Event()
    runs: list[str] = []

    @celery_lock_app.task(base=SingletonTask, shared=False)
    def job() -> str:
        runs.append("ran")
        inside.set()
        assert leave.wait(TIMEOUT)
        return "ran"

    first = threading.Thread(target=job.apply, kwargs={"task_id": "same-id"})
    first.start()
    assert inside.wait(TIMEOUT)
    # The same task id, again: it does not run, and stores nothing over the original.
    copy = job.apply(task_id="same-id")
    assert copy.state == "IGNORED"
    assert task_locks.is_held(job)  # the original still holds its lock
    leave.set()
    first.join()
    assert runs == ["ran"]


def test_backend_down_fail_and_run(celery_lock_app: Celery) -> None:
    celery_lock_app.conf.singleton_lock_url = f"redis://127.0.0.1:{free_port()}/0"

    @celery_lock_app.task(base=SingletonTask, shared=False)
    def strict() -> str:
        return "ran"

    @celery_lock_app.task(base=SingletonTask, lock_backend_down="run", shared=False)
    def lenient() -> str:
        return "ran"

    with pytest.raises(LockBackendError) as info:
        strict.apply().get(timeout=TIMEOUT)
    assert "127.0.0.1" in str(info.value)
    assert lenient.apply().get(timeout=TIMEOUT) == "ran"


def test_lost_lock_is_seen_by_the_running_task(celery_lock_app: Celery) -> None:
    def check_fails(task: Any) -> None:
        with pytest.raises(LockLost):
            task.lock.check()

    with task_losing_its_lock(celery_lock_app, after_lost=check_fails) as long_job:
        assert long_job.apply().get(timeout=TIMEOUT) == "stopped early"


def test_skipped_result_is_recognisable() -> None:
    assert not is_skipped({"lock": "x"})
    assert not is_skipped(None)


def test_retry_after_the_lock_was_lost_still_retries(
    celery_lock_app: Celery, task_locks: TaskLocks
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, bind=True, max_retries=1)
    def job(self: Any) -> int:
        if self.request.retries == 0:
            client = self.lock_client
            client.redis.delete(client.connection.keys(self.lock.name).lock)  # cleared under it
            raise self.retry(countdown=0)
        return int(self.request.retries)

    assert task_locks.assert_ran(job.apply()) == 1  # retried (eagerly), not failed
    assert not task_locks.is_held(job)


def test_an_uncontended_run_calls_no_conflict_path_module(celery_lock_app: Celery) -> None:
    """The run observes what decide() asks for and no more: a run that gets its lock at once
    never reaches the modules of a hold in its way (own holds, waits, holders, evidence,
    enqueue), and calls into at most the modules listed here."""
    import sys

    @celery_lock_app.task(base=SingletonTask, shared=False)
    def job(key: int) -> int:
        return key

    assert job.apply((0,)).get(timeout=TIMEOUT) == 0  # the client and scripts made
    called: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        path = frame.f_code.co_filename
        if event == "call" and "celery_singleton_lock/celery/" in path:
            called.add(path.rsplit("/", 1)[1])

    sys.setprofile(profile)
    try:
        job.apply((1,))
    finally:
        sys.setprofile(None)
    assert called.isdisjoint(
        {"own_holds.py", "waiting_marks.py", "holders.py", "evidence.py", "enqueue.py"}
    ), called
    # The run (task, run_model, sends, done_marks, claims' take-over token), the lock client
    # and settings it looks up (app_client, options), its key (task_keys), the worker's
    # record of held locks (worker) and the signals it sends with their receivers.
    assert called <= {
        "task.py", "run_model.py", "sends.py", "done_marks.py", "claims.py", "app_client.py",
        "options.py", "task_keys.py", "worker.py", "signals.py", "events.py",
    }, called  # fmt: skip


def test_singleton_task_records_its_worker_node_under_the_threads_pool(
    lock_client: LockClient, celery_lock_app: Celery
) -> None:
    # The threads pool puts the machine's name in request.hostname; the node name is needed.
    app = celery_lock_app
    node = f"csltest-threads-{uuid.uuid4().hex[:8]}@{socket.gethostname()}"
    started, finish = threading.Event(), threading.Event()

    @app.task(base=SingletonTask, bind=True, name="csltest.recorded", lock_ttl=30)
    def recorded(self: Any) -> None:
        started.set()
        finish.wait(30)

    with start_worker(
        app,
        pool="threads",
        concurrency=1,
        hostname=node,
        perform_ping_check=False,
        shutdown_timeout=20,
        loglevel="WARNING",
    ):
        try:
            result = recorded.delay()
            assert started.wait(30)
            (info,) = lock_client.locks()
        finally:
            finish.set()
        result.get(timeout=30)
    assert (info.task_id, info.worker, info.info) == (result.id, node, None)
