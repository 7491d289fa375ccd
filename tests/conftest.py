"""Shared fixtures: a Celery app on the test Redis, and an in-process worker for it."""

from __future__ import annotations

import importlib
import pkgutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import hypothesis  # noqa: F401
import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.result import allow_join_result

import celery_singleton_lock
from celery_singleton_lock.celery.app_client import close_lock_client

#: ``cluster``, ``client``, ``sentinels`` and ``prefix``: the fixtures of the tests on local
#: Redis topologies (Cluster, Sentinel); ``proxy``: a proxy that loses a reply on demand;
#: ``outcomes`` and ``runs``: how a worker's runs of a task ended, and what their bodies logged.
pytest_plugins = ["support.topology_fixtures", "support.lost_replies", "support.outcomes"]

# Import everything now, in the main thread. CPython 3.11 before 3.11.8 has a parser that is
# not thread-safe (gh-106905: "AST constructor recursion depth mismatch"): pytest rewrites
# asserts of plugin modules with ast.parse at import, while worker threads format
# tracebacks with ast too, so a lazy import during a test could fail at random.
for _module in pkgutil.walk_packages(celery_singleton_lock.__path__, "celery_singleton_lock."):
    if _module.name != "celery_singleton_lock.__main__":
        importlib.import_module(_module.name)


@pytest.fixture(autouse=True)
def not_a_worker_process() -> Iterator[None]:
    """Each test starts in a process where ``result.get()`` is allowed. Creating a worker's
    pool in this process (solo, threads, prefork) marks it as one where a get would block,
    and only ``start_worker`` undoes that: a test that builds a worker otherwise would make
    a later test's ``get()`` raise, depending on which tests ran before it in this process."""
    with allow_join_result():
        yield


@pytest.fixture
def celery_lock_app(lock_redis_url: str, lock_prefix: str) -> Iterator[Celery]:
    """A Celery app whose broker, result backend and locks are the test Redis; its queue and
    key prefix are unique to the test."""
    app = Celery(f"csltest-{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.conf.update(
        broker_url=lock_redis_url,
        result_backend=lock_redis_url,
        result_expires=600,
        task_default_queue=f"{lock_prefix}queue",
        singleton_lock_prefix=lock_prefix,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    yield app
    close_lock_client(app)


WorkerFactory = Callable[..., AbstractContextManager[Any]]


@pytest.fixture
def in_process_worker() -> WorkerFactory:
    """``with in_process_worker(app, pool="threads", concurrency=4): ...`` runs a real worker
    in this process (declare the app's tasks first)."""

    def start(
        app: Celery, pool: str = "threads", concurrency: int = 4
    ) -> AbstractContextManager[Any]:
        return start_worker(
            app,
            pool=pool,
            concurrency=concurrency,
            perform_ping_check=False,
            shutdown_timeout=20,
            loglevel="WARNING",
        )

    return start
