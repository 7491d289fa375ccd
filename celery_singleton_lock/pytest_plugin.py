"""Old path of :mod:`celery_singleton_lock.celery.pytest_plugin`, kept for one release."""

from .celery.pytest_plugin import *  # noqa: F403
