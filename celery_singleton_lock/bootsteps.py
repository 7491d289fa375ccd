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
        """Stop the worker (by raising :class:`ConfigurationError`) on settings or task
        options that can never work; only warn when Redis is merely down right now."""
        from .config import AppSettings
        from .exceptions import ConfigurationError, LockError
        from .task import SingletonTask, lock_client_for

        app = worker.app
        settings = AppSettings.for_app(app)
        for task in list(app.tasks.values()):
            if isinstance(task, SingletonTask):
                task.check_lock_configuration()
        try:
            client = lock_client_for(app)
            client.ping()
        except ConfigurationError as exc:
            if exc.argument != "url":
                raise
            # The server refused the URL itself (a database it does not have).
            raise ConfigurationError(settings.url_setting, str(exc).partition(": ")[2]) from exc
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
