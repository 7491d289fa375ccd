"""Old path of :class:`celery_singleton_lock.celery.worker.SingletonRequest`, kept for one
release."""

from .celery.worker import SingletonRequest

__all__ = ["SingletonRequest"]
