"""Old path of :mod:`celery_singleton_lock.celery.task_keys` (task arguments -> lock names),
kept for one release."""

from .celery.task_keys import *  # noqa: F403
