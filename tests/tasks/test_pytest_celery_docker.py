"""A smoke test on pytest-celery's Docker set-up: Redis broker and backend containers and a
worker container running a SingletonTask. Skipped when no Docker daemon answers.

pytest-celery's worker image has Celery and redis-py but not this package, so the package's
source goes into the worker's volume next to the task module, as pytest-celery does with
task modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_celery import (
    RESULT_TIMEOUT,
    CeleryBackendCluster,
    CeleryBrokerCluster,
    CeleryTestSetup,
    RedisTestBackend,
    RedisTestBroker,
)

import celery_singleton_lock
from celery_singleton_lock.celery.testing import TaskLocks


def docker_missing() -> str | None:
    """Why Docker cannot be used here, or None if a daemon answers."""
    try:
        import docker

        docker.from_env(timeout=5).ping()
    except Exception as exc:
        return f"no Docker daemon answers ({type(exc).__name__}: {exc})"
    return None


DOCKER_MISSING = docker_missing()
pytestmark = pytest.mark.skipif(
    DOCKER_MISSING is not None, reason=f"Docker-only smoke test: {DOCKER_MISSING}"
)


@pytest.fixture
def celery_broker_cluster(celery_redis_broker: RedisTestBroker) -> Iterator[CeleryBrokerCluster]:
    # Only Redis: a RabbitMQ broker would leave the locks nowhere to live by default.
    cluster = CeleryBrokerCluster(celery_redis_broker)
    yield cluster
    cluster.teardown()


@pytest.fixture
def celery_backend_cluster(
    celery_redis_backend: RedisTestBackend,
) -> Iterator[CeleryBackendCluster]:
    cluster = CeleryBackendCluster(celery_redis_backend)
    yield cluster
    cluster.teardown()


@pytest.fixture
def default_worker_tasks(default_worker_tasks: set[object]) -> set[object]:
    # Imported here, not at the top: a shared task binds itself to every app made after its
    # import, and the rest of the suite need not carry it.
    from apps import docker_tasks

    default_worker_tasks.add(docker_tasks)
    return default_worker_tasks


@pytest.fixture
def default_worker_initial_content(default_worker_initial_content: dict[str, bytes]) -> dict:
    package = Path(celery_singleton_lock.__file__).parent
    for path in sorted(package.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".lua", ".typed"):
            relative = path.relative_to(package).as_posix()
            default_worker_initial_content[f"celery_singleton_lock/{relative}"] = path.read_bytes()
    return default_worker_initial_content


def test_a_docker_worker_skips_a_run_whose_lock_is_held(
    celery_setup: CeleryTestSetup, task_locks: TaskLocks
) -> None:
    from apps import docker_tasks

    app = celery_setup.app
    # The worker keeps its locks in its broker (the default); this process reaches that
    # Redis through a mapped port. Named explicitly, so task_locks may write there.
    app.conf.singleton_lock_url = celery_setup.broker.config()["host_url"]
    report = app.tasks[docker_tasks.smoke_report.name]
    queue = celery_setup.worker.worker_queue

    with task_locks.hold(report, "2026-11-23"):
        skipped = report.s("2026-11-23").apply_async(queue=queue)
        task_locks.assert_skipped(skipped, timeout=RESULT_TIMEOUT)
    ran = report.s("2026-11-23").apply_async(queue=queue)
    assert task_locks.assert_ran(ran, timeout=RESULT_TIMEOUT) == "report 2026-11-23"
