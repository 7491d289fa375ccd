"""The request a SingletonTask body sees: the tracer's own in a worker or ``apply`` run (no
second copy pushed), its own for a direct call and for a task called from inside a body."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from celery import Celery, current_task

from celery_singleton_lock import SingletonTask

WorkerFactory = Callable[..., AbstractContextManager[Any]]

TIMEOUT = 30


def what_the_body_sees(task: Any, tag: str) -> dict[str, Any]:
    request = task.request
    return {
        "tag": tag,
        "id": request.id,
        "args": list(request.args or ()),
        "called_directly": bool(request.called_directly),
        "retries": request.retries or 0,
        "stack": len(task.request_stack),
        "current_task": current_task.name if current_task else None,
        "lock": task.lock.name if task.lock is not None else None,
    }


def declare(app: Celery) -> tuple[Any, Any]:
    @app.task(base=SingletonTask, shared=False, bind=True, name="request.other")
    def other(self: Any, n: int) -> dict[str, Any]:
        return what_the_body_sees(self, "other")

    @app.task(base=SingletonTask, shared=False, bind=True, name="request.job", max_retries=1)
    def job(self: Any, n: int, nested: bool = True, retry: bool = False) -> list[dict[str, Any]]:
        if retry and not self.request.retries:
            raise self.retry(countdown=0)
        seen = [what_the_body_sees(self, "outer")]
        if nested:
            seen.append(self(n + 100, nested=False)[0])  # a direct call of itself
            seen.append(other(n + 200))  # and of another task
            seen.append(what_the_body_sees(self, "outer again"))
        return seen

    return job, other


def check_traced_run(seen: list[dict[str, Any]], task_id: str, job: Any, n: int) -> None:
    outer, nested_self, nested_other, outer_again = seen
    # The tracer's request, pushed once: no copy on top of it.
    assert outer == {
        "tag": "outer",
        "id": task_id,
        "args": [n],
        "called_directly": False,
        "retries": 0,
        "stack": 1,
        "current_task": "request.job",
        "lock": job.lock_name((n,), {}),
    }
    # A direct call of the task inside its body pushes its own request, as Celery does
    # (a copy of the current one with the call's arguments), and runs under its own lock.
    assert nested_self["args"] == [n + 100] and nested_self["stack"] == 2
    assert nested_self["current_task"] == "request.job"
    assert nested_self["lock"] == job.lock_name((n + 100,), {"nested": False})
    # Another task called as a function: its own request, called directly, no lock.
    assert nested_other["args"] == [n + 200] and nested_other["called_directly"]
    assert nested_other["stack"] == 1 and nested_other["current_task"] == "request.other"
    assert nested_other["lock"] is None
    assert outer_again == {**outer, "tag": "outer again"}


def test_a_worker_run_sees_the_tracers_request_and_nested_calls_their_own(
    celery_lock_app: Celery, in_process_worker: WorkerFactory
) -> None:
    job, _ = declare(celery_lock_app)
    with in_process_worker(celery_lock_app):
        result = job.delay(1)
        check_traced_run(result.get(timeout=TIMEOUT), result.id, job, 1)
        retried = job.delay(2, nested=False, retry=True)
        (seen,) = retried.get(timeout=TIMEOUT)
    assert seen["retries"] == 1 and seen["stack"] == 1 and seen["id"] == retried.id
    assert seen["lock"] == job.lock_name((2,), {"nested": False, "retry": True})


def test_an_eager_run_sees_the_tracers_request(celery_lock_app: Celery) -> None:
    job, _ = declare(celery_lock_app)
    result = job.apply(args=(3,))
    check_traced_run(result.get(), result.id, job, 3)


@pytest.mark.parametrize("times", [1, 2])
def test_a_direct_call_pushes_its_own_request(celery_lock_app: Celery, times: int) -> None:
    job, _ = declare(celery_lock_app)
    for _ in range(times):  # the default request is not claimed by the first call
        (seen,) = job(4, nested=False)
        assert seen["called_directly"] and seen["args"] == [4] and seen["stack"] == 1
        assert seen["lock"] is None and seen["current_task"] == "request.job"
        assert len(job.request_stack) == 0
