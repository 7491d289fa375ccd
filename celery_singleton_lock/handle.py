"""Old path of :mod:`celery_singleton_lock.core.handle` (what every lock handle shares),
kept for one release."""

from .core.handle import *  # noqa: F403
from .core.handle import RenewEntry as RenewEntry
