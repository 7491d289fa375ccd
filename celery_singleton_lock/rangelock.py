"""Old path of :mod:`celery_singleton_lock.kinds.rangelock`, kept for one release."""

from .kinds.rangelock import *  # noqa: F403
from .kinds.rangelock import FAMILY as FAMILY
