"""Old path of :mod:`celery_singleton_lock.core.scripts` (the Lua scripts),
kept for one release."""

from .core.scripts import *  # noqa: F403
