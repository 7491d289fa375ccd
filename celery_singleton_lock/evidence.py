"""Old path of :mod:`celery_singleton_lock.celery.evidence`, kept for one release."""

from .celery.evidence import *  # noqa: F403
