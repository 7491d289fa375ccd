"""Old path of :mod:`celery_singleton_lock.celery.enqueue`, kept for one release."""

from .celery.enqueue import *  # noqa: F403
