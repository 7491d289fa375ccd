"""An app whose tasks are not SingletonTasks, locked by name through the setting
``singleton_lock_tasks`` (read from ``CSL_NAMED_TASKS``, JSON), for
``tests/tasks/test_named_tasks.py`` to run in real ``celery worker`` processes; its result
backend is ``CSL_RESULT_BACKEND`` when set (one without native chords runs Celery's
``celery.chord_unlock``). Its tasks record what they do (recording.py); a base class's
``__call__`` wrapper records whether the run's lock is held while it runs, as is and combined
with SingletonTask in both orders."""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery, Task

from celery_singleton_lock import LockClient, SingletonTask

from .recording import app_from_environment, busy_for, configured_app, record

DEFAULT_SETTING = {
    "named.export": {"lock_key": ["customer_id"], "lock_lease": 10},
    "named.wrapped": {},
}


class Wrapping(Task):  # type: ignore[misc]
    """A base class as another package writes one: its ``__call__`` wraps every run (a
    database transaction, a tenant context, error reporting). It records that it ran and
    whether the run's lock was held then, as a second lock client sees it."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        conf = self.app.conf
        prefix = conf.singleton_lock_prefix
        client = LockClient.from_url(conf.singleton_lock_url, prefix=prefix)
        try:
            held = any(
                info.task_id == self.request.id and info.state == "live" for info in client.locks()
            )
        finally:
            client.close()
        record(self, prefix, "wrapper", None, held=held)
        return super().__call__(*args, **kwargs)


class LockedWrapping(SingletonTask, Wrapping):
    """SingletonTask first: its lock is taken around the base class's wrapper."""


class WrappingLocked(Wrapping, SingletonTask):
    """The base class first: its wrapper runs around the lock, before it is taken."""


def make_app(url: str, prefix: str, queue: str = "celery") -> Celery:
    app = configured_app("named_tasks_app", url, prefix, queue)
    app.conf.singleton_lock_tasks = json.loads(
        os.environ.get("CSL_NAMED_TASKS", json.dumps(DEFAULT_SETTING))
    )
    if os.environ.get("CSL_RESULT_BACKEND"):
        app.conf.result_backend = os.environ["CSL_RESULT_BACKEND"]
        # How often celery.chord_unlock looks whether a chord's header is done.
        app.conf.result_chord_retry_interval = 0.1

    # Plain tasks, as another package declares them: no base=SingletonTask. Each only in
    # this app (shared=False): a shared task would join every app made later in the process,
    # where the next make_app's task of the same name collides with it.
    @app.task(bind=True, shared=False, name="named.export")
    def export(self: Any, customer_id: int, seconds: float) -> int:
        record(self, prefix, "start", str(customer_id), task=self.name)
        busy_for(seconds)
        record(self, prefix, "end", str(customer_id), task=self.name)
        return customer_id

    @app.task(bind=True, shared=False, name="named.unlocked")
    def unlocked(self: Any) -> str:
        return "ran"

    @app.task(shared=False, name="named.total")
    def total(values: list[int]) -> int:
        return sum(values)

    @app.task(bind=True, base=Wrapping, shared=False, name="named.wrapped")
    def wrapped(self: Any, key: str) -> str:
        record(self, prefix, "body", key)
        return key

    # SingletonTasks whose class has a base class with a __call__ of its own.
    @app.task(bind=True, base=LockedWrapping, shared=False, name="named.locked_wrapping")
    def locked_wrapping(self: Any, key: str) -> str:
        record(self, prefix, "body", key)
        return key

    @app.task(bind=True, base=WrappingLocked, shared=False, name="named.wrapping_locked")
    def wrapping_locked(self: Any, key: str) -> str:
        record(self, prefix, "body", key)
        return key

    return app


app = app_from_environment(make_app)
