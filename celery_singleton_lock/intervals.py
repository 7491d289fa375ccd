"""Old path of :mod:`celery_singleton_lock.kinds.intervals`, kept for one release."""

from .kinds.intervals import *  # noqa: F403
