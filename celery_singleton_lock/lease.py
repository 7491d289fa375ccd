"""Old path of :mod:`celery_singleton_lock.kinds.lease`, kept for one release."""

from .kinds.lease import *  # noqa: F403
