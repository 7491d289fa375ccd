"""Old path of :mod:`celery_singleton_lock.core.validate` (argument validation),
kept for one release."""

from .core.validate import *  # noqa: F403
