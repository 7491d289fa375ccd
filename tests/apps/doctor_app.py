"""A Celery app for the ``celery -A apps.doctor_app locks doctor`` and worker tests: its broker
and locks are the Redis the test names in the environment."""

import os

from celery import Celery

from celery_singleton_lock import SingletonTask

app = Celery("doctor_app", set_as_current=False)
app.conf.update(
    broker_url=os.environ.get("CSL_TEST_BROKER_URL", "memory://"),
    singleton_lock_prefix=os.environ.get("CSL_TEST_LOCK_PREFIX", "csl:"),
    worker_hijack_root_logger=False,
)


@app.task(base=SingletonTask, name="doctor_app.locked")
def locked() -> None:
    """A SingletonTask with the default lease."""
