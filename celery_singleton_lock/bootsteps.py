"""The worker step: checks the lock Redis at worker start and frees this process's locks at
stop. ``install(app)`` adds it (SingletonTask does so when bound; there is no entry point
for bootsteps)."""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

log = logging.getLogger("celery_singleton_lock.worker")


class SingletonLockStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker bootstep of celery_singleton_lock."""

    label = "singleton-lock"

    def start(self, worker: Any) -> None:
        from .exceptions import LockError
        from .task import lock_client_for

        try:
            client = lock_client_for(worker.app)
            client.ping()
        except LockError as exc:
            log.warning("singleton locks: Redis not reachable at start: %s", exc)
            return
        log.info("singleton locks on %s (prefix %r)", client.url, client.prefix)

    def stop(self, worker: Any) -> None:
        from .signals import release_all_held

        release_all_held()

    shutdown = stop


def install(app: Any) -> None:
    """Add the worker step to ``app`` (idempotent)."""
    steps = app.steps["worker"]
    if SingletonLockStep not in steps:
        steps.add(SingletonLockStep)
