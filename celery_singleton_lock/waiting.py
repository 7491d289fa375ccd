"""Old path of :mod:`celery_singleton_lock.notifier` (the release notifier),
kept for one release."""

from .notifier import *  # noqa: F403
