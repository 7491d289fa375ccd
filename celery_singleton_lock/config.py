"""Old path of :mod:`celery_singleton_lock.celery.options`, kept for one release."""

from .celery.options import *  # noqa: F403
