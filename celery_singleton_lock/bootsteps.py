"""Old path of the worker step (:mod:`celery_singleton_lock.celery.worker`), kept for one
release."""

from .celery.worker import SingletonLockStep, install

__all__ = ["SingletonLockStep", "install"]
