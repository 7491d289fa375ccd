"""Old path of :mod:`celery_singleton_lock.celery.claims`, kept for one release."""

from .celery.claims import *  # noqa: F403
