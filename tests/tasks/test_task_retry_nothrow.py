"""``self.retry(throw=False)`` on a real in-process worker: Celery sends the retry and the body
goes on, so the lock stays this attempt's until the body ends and only then passes to the
retry, which never runs beside it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from celery import Celery

from celery_singleton_lock import SingletonTask
from celery_singleton_lock.celery.testing import TaskLocks

WorkerFactory = Callable[..., AbstractContextManager[Any]]

TIMEOUT = 30
#: How long attempt 0 goes on after ``retry(throw=False)``, giving a retry that was let in
#: too early the time to start beside it.
GOES_ON = 3.0


def test_retry_without_throw_hands_the_lock_over_when_the_body_ends(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    retry_started, retry_done = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    @celery_lock_app.task(base=SingletonTask, shared=False, bind=True, max_retries=1)
    def job(self: Any) -> str:
        if self.request.retries:
            retry_started.set()
            seen["retry_holds"] = self.lock is not None and self.lock.held
            retry_done.set()
            return "retried"
        self.retry(countdown=0, throw=False)
        # Only a retry started too early could set this while attempt 0 still runs.
        seen["retry_ran_beside"] = retry_started.wait(GOES_ON)
        seen["held_after_retry"] = self.lock is not None and self.lock.held
        holders = self.lock_client.holders(self.lock_name())
        seen["holder"] = [(holder.task_id, holder.owner == self.lock.owner) for holder in holders]
        self.lock.check()  # Redis has it as this run's: raises LockLost otherwise
        return "first"

    with in_process_worker(celery_lock_app, concurrency=2):
        result = job.delay()
        assert retry_done.wait(TIMEOUT), "the retry never ran"
    assert seen == {
        "held_after_retry": True,  # still this attempt's lock...
        "holder": [(result.id, True)],  # ...not yet the retry's claim
        "retry_ran_beside": False,
        "retry_holds": True,  # the retry took the lock handed over to it
    }, seen
    assert not task_locks.is_held(job)


def test_retry_without_throw_past_max_retries_keeps_the_lock_to_the_end(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    seen: dict[str, Any] = {}
    done = threading.Event()

    @celery_lock_app.task(base=SingletonTask, shared=False, bind=True, max_retries=0)
    def job(self: Any) -> str:
        try:
            self.retry(countdown=0, throw=False)
        except Exception as exc:  # noqa: BLE001 - MaxRetriesExceededError, reported
            seen["error"] = type(exc).__name__
        seen["held"] = self.lock is not None and self.lock.held
        done.set()
        return "done"

    with in_process_worker(celery_lock_app, concurrency=1):
        assert job.delay().get(timeout=TIMEOUT) == "done"
    assert done.is_set()
    assert seen == {"error": "MaxRetriesExceededError", "held": True}, seen
    assert not task_locks.is_held(job)


def test_retry_without_throw_is_sent_when_the_body_then_fails(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    """As with Celery, the retry runs however the rest of the body ends; it is sent from the
    run's end, holding the lock handed over to it."""
    seen: dict[str, Any] = {}
    done = threading.Event()

    @celery_lock_app.task(base=SingletonTask, shared=False, bind=True, max_retries=1)
    def job(self: Any) -> str:
        if self.request.retries:
            seen["retry_holds"] = self.lock is not None and self.lock.held
            done.set()
            return "retried"
        self.retry(countdown=0, throw=False)
        raise RuntimeError("the rest of attempt 0 failed")

    with in_process_worker(celery_lock_app, concurrency=1):
        job.delay()
        assert done.wait(TIMEOUT), "the retry never ran"
    assert seen == {"retry_holds": True}, seen
    assert not task_locks.is_held(job)
