"""Old path of :mod:`celery_singleton_lock.celery.signals` (the lock signals), kept for one
release; the worker's receivers of Celery's signals, once re-exported here, live in
:mod:`celery_singleton_lock.celery.worker`."""

from .celery.signals import *  # noqa: F403
from .celery.worker import free_revoked_claim as free_revoked_claim
from .celery.worker import release_all_held as release_all_held
