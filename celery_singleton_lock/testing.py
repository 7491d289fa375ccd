"""Old path of :mod:`celery_singleton_lock.celery.testing`, kept for one release."""

from .celery.testing import *  # noqa: F403
