"""The Prometheus recipe: metrics updated from our signals by runs on a real in-process
worker, read back from a prometheus_client registry."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from apps.worker_app import make_app
from celery import Celery
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from support.lost_lock import task_losing_its_lock
from support.workers import WorkerPrograms

from celery_singleton_lock import SingletonTask
from celery_singleton_lock.celery.prometheus import LockMetrics, register_metrics
from celery_singleton_lock.celery.testing import TaskLocks

WorkerFactory = Callable[..., AbstractContextManager[Any]]

TIMEOUT = 30


@pytest.fixture
def metrics() -> Iterator[LockMetrics]:
    metrics = register_metrics(CollectorRegistry())
    yield metrics
    metrics.close()


def value(metrics: LockMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_runs_are_counted_by_task(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    task_locks: TaskLocks,
    metrics: LockMetrics,
) -> None:
    started, finish = threading.Event(), threading.Event()

    @celery_lock_app.task(base=SingletonTask, shared=False)
    def job(customer: int) -> int:
        started.set()
        assert finish.wait(TIMEOUT)
        return customer

    with in_process_worker(celery_lock_app):
        first = job.delay(1)
        assert started.wait(TIMEOUT)
        task_locks.assert_skipped(job.delay(1))
        finish.set()
        task_locks.assert_ran(first)
        task_locks.assert_ran(job.delay(2))

    task = job.name
    assert value(metrics, "celery_singleton_lock_acquired_total", task=task) == 2
    assert value(metrics, "celery_singleton_lock_skipped_total", task=task) == 1
    assert value(metrics, "celery_singleton_lock_released_total", task=task) == 2
    assert value(metrics, "celery_singleton_lock_lost_total", task=task) == 0
    acquired = {"task": task, "outcome": "acquired"}
    assert value(metrics, "celery_singleton_lock_wait_seconds_count", **acquired) == 2
    skipped = {"task": task, "outcome": "skipped"}
    assert value(metrics, "celery_singleton_lock_wait_seconds_count", **skipped) == 1
    assert b"celery_singleton_lock_acquired_total" in generate_latest(metrics.registry)


def test_wait_time_lands_in_the_histogram(
    celery_lock_app: Celery, task_locks: TaskLocks, metrics: LockMetrics
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_wait=0.3)
    def job() -> str:
        return "ran"

    with task_locks.hold(job):
        task_locks.assert_skipped(job.apply())  # sat out its 0.3 s first
    labels = {"task": job.name, "outcome": "skipped"}
    assert value(metrics, "celery_singleton_lock_wait_seconds_sum", **labels) >= 0.3
    assert value(metrics, "celery_singleton_lock_wait_seconds_bucket", le="0.25", **labels) == 0
    assert value(metrics, "celery_singleton_lock_wait_seconds_bucket", le="1.0", **labels) == 1


def test_a_lost_lock_is_counted(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, metrics: LockMetrics
) -> None:
    with task_losing_its_lock(celery_lock_app) as long_job, in_process_worker(celery_lock_app):
        assert long_job.delay().get(timeout=TIMEOUT) == "stopped early"
    assert value(metrics, "celery_singleton_lock_lost_total", task=long_job.name) == 1


def test_registering_twice_gives_the_same_metrics_and_close_stops_counting(
    celery_lock_app: Celery, task_locks: TaskLocks
) -> None:
    registry = CollectorRegistry()
    metrics = register_metrics(registry)
    assert register_metrics(registry) is metrics  # no "Duplicated timeseries" error

    @celery_lock_app.task(base=SingletonTask, shared=False)
    def job() -> str:
        return "ran"

    task_locks.assert_ran(job.apply())
    assert registry.get_sample_value("celery_singleton_lock_acquired_total", {"task": job.name})
    metrics.close()
    task_locks.assert_ran(job.apply())
    assert (
        registry.get_sample_value("celery_singleton_lock_acquired_total", {"task": job.name})
        is None
    )
    again = register_metrics(registry)  # a fresh start in the same registry
    try:
        task_locks.assert_ran(job.apply())
        labels = {"task": job.name}
        assert registry.get_sample_value("celery_singleton_lock_acquired_total", labels) == 1
    finally:
        again.close()


def test_a_prefork_worker_counts_in_multiprocess_mode(
    lock_redis_url: str, lock_prefix: str, tmp_path: Path, task_locks: TaskLocks
) -> None:
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    workers = WorkerPrograms(
        "apps.metrics_app", make_app, lock_redis_url, lock_prefix, tmp_path, "metrics"
    )
    short_lease = workers.app.tasks["worker_app.short_lease"]
    long_lease = workers.app.tasks["worker_app.long_lease"]
    try:
        env = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
        workers.launch("metrics", [workers.queue("metrics")], env=env)
        task_locks.assert_ran(short_lease.delay("a", 0), timeout=60)
        task_locks.assert_ran(short_lease.delay("b", 0), timeout=60)
        with task_locks.hold(long_lease, "c", 0):
            task_locks.assert_skipped(long_lease.delay("c", 0), timeout=60)
    finally:
        workers.close()

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))

    def total(name: str, task: str) -> float | None:
        return registry.get_sample_value(name, {"task": task})

    assert total("celery_singleton_lock_acquired_total", short_lease.name) == 2
    assert total("celery_singleton_lock_released_total", short_lease.name) == 2
    assert total("celery_singleton_lock_skipped_total", long_lease.name) == 1
    labels = {"task": short_lease.name, "outcome": "acquired"}
    assert registry.get_sample_value("celery_singleton_lock_wait_seconds_count", labels) == 2
