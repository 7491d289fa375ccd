"""The worker step: checks the lock Redis at worker start and frees this process's locks at
stop. ``install(app)`` adds it (SingletonTask does so when bound; there is no entry point
for bootsteps).

Steps stop in the reverse order of their start, so the step puts itself just before the
``Pool`` step: it then stops only after the pool has stopped, that is after the running
tasks have finished (warm shutdown) or been cut off (cold shutdown). Its place cannot be
asked for with ``requires``: nothing the ``Pool`` step requires can require it, and the
order of steps that do not depend on each other changes from one start to the next.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.worker.components import Pool

log = logging.getLogger("celery_singleton_lock.worker")


class SingletonLockStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker bootstep of celery_singleton_lock."""

    label = "singleton-lock"

    def include(self, worker: Any) -> bool:
        """Take part in the worker's start and stop, placed before the ``Pool`` step."""
        included, obj = self._should_include(worker)
        if included:
            self.obj = obj
            steps = worker.steps
            pool = next((i for i, step in enumerate(steps) if isinstance(step, Pool)), None)
            steps.insert(len(steps) if pool is None else pool, self)
        return bool(included)

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
        """Warm shutdown: the pool has drained, so no task of this process runs any more;
        release whatever is still held (each run released its own lock already)."""
        from .signals import release_all_held

        release_all_held()

    shutdown = stop

    def terminate(self, worker: Any) -> None:
        """Cold shutdown: release nothing. A run the pool cut off (a child terminated, a
        greenlet killed, the solo pool's body interrupted) released its own lock on its way
        out; a thread cannot be cut off, so its run goes on to its end holding its lock, and
        releasing that here would let another run in beside it. A lock whose holder dies
        without a word runs out within its lease."""


def install(app: Any) -> None:
    """Add the worker step to ``app`` (idempotent)."""
    steps = app.steps["worker"]
    if SingletonLockStep not in steps:
        steps.add(SingletonLockStep)
