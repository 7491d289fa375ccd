"""Old path of :mod:`celery_singleton_lock.celery.prometheus`, kept for one release."""

from .celery.prometheus import *  # noqa: F403
