"""An app none of whose tasks is a SingletonTask, locked by name through the setting
``singleton_lock_tasks`` (read from ``CSL_NAMED_TASKS``, JSON), for ``tests/test_named_tasks.py``
to run in real ``celery worker`` processes. Its tasks record what they do (recording.py)."""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery

from .recording import app_from_environment, busy_for, configured_app, record

DEFAULT_SETTING = {"named.export": {"lock_key": ["customer_id"], "lock_lease": 10}}


def make_app(url: str, prefix: str, queue: str = "celery") -> Celery:
    app = configured_app("named_tasks_app", url, prefix, queue)
    app.conf.singleton_lock_tasks = json.loads(
        os.environ.get("CSL_NAMED_TASKS", json.dumps(DEFAULT_SETTING))
    )

    # Plain tasks, as another package declares them: no base=SingletonTask.
    @app.task(bind=True, name="named.export")
    def export(self: Any, customer_id: int, seconds: float) -> int:
        record(self, prefix, "start", str(customer_id), task=self.name)
        busy_for(seconds)
        record(self, prefix, "end", str(customer_id), task=self.name)
        return customer_id

    @app.task(bind=True, name="named.unlocked")
    def unlocked(self: Any) -> str:
        return "ran"

    return app


app = app_from_environment(make_app)
