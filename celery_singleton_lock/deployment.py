"""Old path of :mod:`celery_singleton_lock.core.redis_urls` (Redis URLs -> clients),
kept for one release."""

from .core.redis_urls import *  # noqa: F403
