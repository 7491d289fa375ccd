"""Old path of the worker step (:mod:`celery_singleton_lock.worker`), kept for one release."""

from .worker import SingletonLockStep, install

__all__ = ["SingletonLockStep", "install"]
