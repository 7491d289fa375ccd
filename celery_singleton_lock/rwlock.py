"""Old path of :mod:`celery_singleton_lock.kinds.rwlock`, kept for one release."""

from .kinds.rwlock import *  # noqa: F403
from .kinds.rwlock import FAMILY as FAMILY
