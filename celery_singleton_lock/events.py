"""Old path of :mod:`celery_singleton_lock.celery.events`, kept for one release."""

from .celery.events import *  # noqa: F403
from .celery.events import _announced as _announced
