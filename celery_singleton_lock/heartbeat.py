"""Old path of :mod:`celery_singleton_lock.core.heartbeat` (the per-process renewal thread),
kept for one release."""

from .core.heartbeat import *  # noqa: F403
