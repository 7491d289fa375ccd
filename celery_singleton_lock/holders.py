"""Old path of :mod:`celery_singleton_lock.celery.holders`, kept for one release."""

from .celery.holders import *  # noqa: F403
