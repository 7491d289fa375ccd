"""Old path of :mod:`celery_singleton_lock.celery.worker`, kept for one release."""

from .celery.worker import *  # noqa: F403
