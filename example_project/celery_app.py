"""The example's Celery app. Broker, result backend and locks all live in the Redis at
``$REDIS_URL`` (``python -m example_project`` starts a throwaway one when it is unset)."""

from __future__ import annotations

import os

from celery import Celery

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("example_project", include=["example_project.tasks"])
app.conf.update(
    broker_url=REDIS_URL,
    result_backend=REDIS_URL,
    result_expires=3600,
    broker_connection_retry_on_startup=True,
    # Locks: where they live, and defaults for every SingletonTask (a task can override).
    singleton_lock_prefix="example:",
    singleton_lock_lease=6,  # a dead worker frees its locks within 6 s
    worker_log_format="%(asctime)s %(levelname)-7s %(processName)-16s %(message)s",
    worker_task_log_format=(
        "%(asctime)s %(levelname)-7s %(processName)-16s %(task_name)s: %(message)s"
    ),
    beat_schedule={
        # "Hourly" in spirit; every 4 s here so the demo shows overlaps within a minute.
        "sales-report": {"task": "example_project.tasks.sales_report", "schedule": 4.0},
    },
)
