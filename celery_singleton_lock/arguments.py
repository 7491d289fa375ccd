"""Old path of :mod:`celery_singleton_lock.validate` (argument validation),
kept for one release."""

from .validate import *  # noqa: F403
