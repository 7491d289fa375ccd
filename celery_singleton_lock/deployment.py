"""Old path of :mod:`celery_singleton_lock.redis_urls` (Redis URLs -> clients),
kept for one release."""

from .redis_urls import *  # noqa: F403
