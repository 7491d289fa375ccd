"""Old path of :mod:`celery_singleton_lock.core.notifier` (the release notifier),
kept for one release."""

from .core.notifier import *  # noqa: F403
