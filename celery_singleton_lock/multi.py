"""Old path of :mod:`celery_singleton_lock.kinds.multi`, kept for one release."""

from .kinds.multi import *  # noqa: F403
