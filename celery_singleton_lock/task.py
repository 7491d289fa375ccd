"""Old path of :mod:`celery_singleton_lock.celery.task`, kept for one release."""

from .celery.task import *  # noqa: F403
