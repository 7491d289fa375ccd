"""A copy of a running call (the same message delivered again: ``acks_late`` with a visibility
timeout shorter than the run) never runs its body beside the original when the task's holds
share: read and upgradable holds, semaphore permits (``lock_limit``), read holds of a range.
Shared holds let a different call in beside a run; the acquire refuses the one of the same
call (``held_by_call``), and the copy is re-queued as a copy of a live exclusive lease is.

On a real in-process worker (threads pool); the second delivery is the same message sent
again with the same task id and attempt, as the broker would deliver it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from celery import Celery
from celery.signals import task_postrun
from support.waiting import wait_for

from celery_singleton_lock import SingletonTask
from celery_singleton_lock.celery.sends import SEND_HEADER, send_of

WorkerFactory = Callable[..., AbstractContextManager[Any]]

TIMEOUT = 30.0

#: The task options of each kind of shared hold.
SHARED: dict[str, dict[str, Any]] = {
    "read": {"lock_mode": "read"},
    "upgradable": {"lock_mode": "upgradable"},
    "limit": {"lock_limit": 2},
    "range read": {"lock_mode": "read", "lock_range": ("lo", "hi")},
}


class Bodies:
    """What the bodies of one task write: each entry and exit, and the most inside at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0
        self.entered: list[str] = []
        self.sends: list[str] = []

    def enter(self, task_id: str, send: str = "") -> None:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.entered.append(task_id)
            self.sends.append(send)

    def leave(self) -> None:
        with self.lock:
            self.inside -= 1


class Ends:
    """The states in which the worker finished deliveries of one task id (task_postrun:
    also a delivery ignored before its body)."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.states: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, task_id: str = "", state: Any = None, **_: Any) -> None:
        if task_id == self.task_id:
            with self.lock:
                self.states.append(str(state))

    def count(self, state: str) -> int:
        with self.lock:
            return self.states.count(state)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", list(SHARED))
def test_a_copy_of_a_running_call_is_requeued_not_run_beside_it(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, kind: str
) -> None:
    bodies, gate = Bodies(), threading.Event()

    @celery_lock_app.task(
        base=SingletonTask, bind=True, shared=False, name="shared.copied",
        lock_key="copied:{key}", lock_lease=1, **SHARED[kind],
    )  # fmt: skip
    def copied(self: Any, key: str, lo: int = 0, hi: int = 10) -> str:
        bodies.enter(self.request.id, send_of(self.request))
        try:
            assert gate.wait(TIMEOUT)
        finally:
            bodies.leave()
        return "ran"

    with in_process_worker(celery_lock_app, concurrency=3):
        result = copied.delay("k")
        wait_for(lambda: bodies.entered, TIMEOUT, "the original to run")
        ends = Ends(result.id)
        task_postrun.connect(ends, weak=False)
        try:
            # The same message again, as the broker delivers it once its visibility timeout
            # passed while the original runs: same task id, same attempt, same send.
            celery_lock_app.send_task(
                copied.name, ("k",), task_id=result.id, headers={SEND_HEADER: bodies.sends[0]}
            )
            wait_for(
                lambda: ends.count("IGNORED") or len(bodies.entered) > 1,
                TIMEOUT,
                "the copy to be dealt with",
            )
            assert bodies.entered == [result.id] and bodies.most == 1
            gate.set()
            assert result.get(timeout=TIMEOUT) == "ran"
            # The copy, re-queued behind its live original, comes back and is dropped: the
            # original's result is in.
            wait_for(lambda: ends.count("IGNORED") >= 2, TIMEOUT, "the re-queued copy")
        finally:
            gate.set()
            task_postrun.disconnect(ends)
    assert bodies.entered == [result.id] and bodies.most == 1
    assert result.state == "SUCCESS"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["read", "limit"])
def test_another_call_still_runs_beside_a_shared_run(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, kind: str
) -> None:
    bodies, gate = Bodies(), threading.Event()

    @celery_lock_app.task(
        base=SingletonTask, bind=True, shared=False, name="shared.beside",
        lock_key="beside:{key}", lock_lease=1, **SHARED[kind],
    )  # fmt: skip
    def beside(self: Any, key: str) -> str:
        bodies.enter(self.request.id)
        try:
            assert gate.wait(TIMEOUT)
        finally:
            bodies.leave()
        return "ran"

    with in_process_worker(celery_lock_app, concurrency=3):
        try:
            first, second = beside.delay("k"), beside.delay("k")
            wait_for(lambda: bodies.most == 2, TIMEOUT, "both calls to run at once")
        finally:
            gate.set()
        assert first.get(timeout=TIMEOUT) == second.get(timeout=TIMEOUT) == "ran"


@pytest.mark.timeout(120)
def test_a_retry_is_not_held_back_by_its_earlier_attempts_release_delay(
    celery_lock_app: Celery, in_process_worker: WorkerFactory
) -> None:
    # The first attempt's read hold stays a minute in its release delay: its call ended
    # there, so the retry of that call (same task id) takes its own read hold at once.
    @celery_lock_app.task(
        base=SingletonTask, bind=True, shared=False, name="shared.retried",
        lock_key="retried:{key}", lock_mode="read", lock_release_delay=60, max_retries=1,
    )  # fmt: skip
    def retried(self: Any, key: str) -> int:
        if not self.request.retries:
            raise self.retry(countdown=0)
        return int(self.request.retries)

    with in_process_worker(celery_lock_app, concurrency=2):
        assert retried.delay("k").get(timeout=TIMEOUT) == 1
