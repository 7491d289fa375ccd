"""SingletonTask on every worker pool, and every way a worker stops.

In-process workers (threads pool) show that the worker step frees locks only after the pool
has stopped. Real ``celery worker`` subprocesses (``pool_app.py``) run the matrix over the
prefork, threads, solo, gevent and eventlet pools: mutual exclusion under four-way
concurrency, a SIGKILLed worker freed within the lease, warm and cold shutdown, and a
CPU-bound body under gevent/eventlet that starves the heartbeat.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import TestWorkController, setup_app_for_worker, start_worker
from celery.worker.components import Pool
from waiting_helpers import wait_for

from celery_singleton_lock import LockClient, SingletonTask, lock_released
from celery_singleton_lock.bootsteps import SingletonLockStep, install

TIMEOUT = 30.0


# -- the worker step's place --------------------------------------------------------------------


def step_index(worker: Any, kind: type) -> int:
    return next(i for i, step in enumerate(worker.steps) if isinstance(step, kind))


def test_the_step_starts_before_the_pool_so_it_stops_after_it(celery_lock_app: Celery) -> None:
    install(celery_lock_app)
    worker = celery_lock_app.WorkController(
        pool="threads", concurrency=1, without_heartbeat=True, without_mingle=True,
        without_gossip=True,
    )  # fmt: skip
    assert step_index(worker, SingletonLockStep) < step_index(worker, Pool)
    # Steps that do not depend on each other come in an order that changes with the string
    # hash seed: the step also finds its place when it is included after the pool.
    step = worker.steps.pop(step_index(worker, SingletonLockStep))
    assert step.include(worker)
    assert step_index(worker, SingletonLockStep) == step_index(worker, Pool) - 1


class Gate:
    """A task of the app that holds its lock until the test opens the gate."""

    def __init__(self, app: Celery) -> None:
        self.started = threading.Event()
        self.open = threading.Event()
        self.released: list[str] = []

        @app.task(base=SingletonTask, bind=True, shared=False, lock_key="gate", lock_lease=3)
        def gated(task: Any) -> int:
            self.started.set()
            assert self.open.wait(TIMEOUT), "the test never opened the gate"
            return int(task.lock.token)

        def on_released(sender: Any, task_id: str, **_: Any) -> None:
            if getattr(sender, "name", None) == gated.name:
                self.released.append(task_id)

        lock_released.connect(on_released, weak=False)
        self._on_released = on_released
        self.task = gated

    def close(self) -> None:
        self.open.set()
        lock_released.disconnect(self._on_released)


@pytest.fixture
def gate(celery_lock_app: Celery) -> Iterator[Gate]:
    gate = Gate(celery_lock_app)
    yield gate
    gate.close()


def holder_task_id(client: LockClient, name: str) -> str | None:
    value = client.redis.hget(client._keys(name).lock, "task_id")
    return value.decode() if value is not None else None


@pytest.mark.timeout(90)
def test_worker_stop_releases_only_after_the_threads_pool_drained(
    celery_lock_app: Celery, gate: Gate, lock_client: LockClient
) -> None:
    """``WorkController.stop()`` (warm): the running task keeps its lock until it ends."""
    setup_app_for_worker(celery_lock_app, "WARNING", None)
    worker = TestWorkController(
        app=celery_lock_app, pool="threads", concurrency=2, without_heartbeat=True,
        without_mingle=True, without_gossip=True, loglevel="WARNING", ready_callback=None,
    )  # fmt: skip
    runner = threading.Thread(target=worker.start, daemon=True)
    runner.start()
    worker.ensure_started()
    result = gate.task.delay()
    assert gate.started.wait(TIMEOUT)
    stopper = threading.Thread(target=worker.stop, daemon=True)
    stopper.start()
    # The threads pool is stopping: it waits for the running task. Every step stopped
    # before it has stopped by now.
    wait_for(lambda: worker.pool.executor._shutdown, TIMEOUT, "the pool to stop")
    assert holder_task_id(lock_client, "gate") == result.id
    assert gate.released == []
    gate.open.set()
    stopper.join(TIMEOUT)
    runner.join(TIMEOUT)
    assert not stopper.is_alive() and not runner.is_alive()
    assert gate.released == [result.id]  # released by the run itself, when it ended
    assert holder_task_id(lock_client, "gate") is None


@pytest.mark.timeout(90)
def test_start_worker_exit_leaves_a_running_threads_task_its_lock(
    celery_lock_app: Celery, gate: Gate, lock_client: LockClient
) -> None:
    """``start_worker`` ends with a cold shutdown, which does not wait for the threads
    pool: the task still runs after it, so it still holds (and renews) its lock."""
    with start_worker(
        celery_lock_app, pool="threads", concurrency=2, perform_ping_check=False,
        shutdown_timeout=20, loglevel="WARNING",
    ):  # fmt: skip
        result = gate.task.delay()
        assert gate.started.wait(TIMEOUT)
    assert holder_task_id(lock_client, "gate") == result.id
    assert gate.released == []
    gate.open.set()
    wait_for(lambda: gate.released, TIMEOUT, "the run to release its lock")
    assert gate.released == [result.id]
    assert holder_task_id(lock_client, "gate") is None
