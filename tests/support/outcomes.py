"""Fixtures for tests that count the runs of an app's tasks: ``outcomes``, the state each
run ended in as the worker reported it (``task_postrun``), and ``runs``, a Redis list the
tasks' bodies log to."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.signals import task_postrun

TIMEOUT = 60.0


class Outcomes:
    """The state each run of ``app``'s tasks ended in (``task_postrun``), in order."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.states: list[tuple[str, str]] = []
        self.changed = threading.Condition()
        task_postrun.connect(self.record, weak=False)

    def record(self, sender: Any = None, task_id: str = "", state: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is self.app:
            with self.changed:
                self.states.append((task_id, str(state)))
                self.changed.notify_all()

    def wait(self, count: int, timeout: float = TIMEOUT) -> list[str]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.states) >= count, timeout), self.states
            return [state for _, state in self.states]

    def close(self) -> None:
        task_postrun.disconnect(self.record)


@pytest.fixture
def outcomes(celery_lock_app: Celery) -> Iterator[Outcomes]:
    found = Outcomes(celery_lock_app)
    yield found
    found.close()


@pytest.fixture
def runs(lock_redis_url: str, lock_prefix: str) -> Iterator[tuple[redis.Redis, str]]:
    """A client of the test Redis and the key of a list the tasks' bodies log to."""
    client = redis.Redis.from_url(lock_redis_url)
    key = f"{lock_prefix}runs"
    yield client, key
    client.delete(key)
    client.close()
