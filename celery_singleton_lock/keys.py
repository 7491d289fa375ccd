"""Old path of :mod:`celery_singleton_lock.core.keys` (lock names -> Redis keys),
kept for one release."""

from .core.keys import *  # noqa: F403
