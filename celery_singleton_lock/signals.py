"""Our signals, and receivers of Celery's that release locks when worker processes end.

Each of our signals is sent with the task as sender and the keyword arguments ``name``
(the lock name), ``task_id`` and ``lease`` (None for ``lock_skipped``). ``lock_acquired`` and
``lock_skipped`` also carry ``wait`` (seconds the run waited for its lock), and
``lock_skipped`` carries ``holder`` (the holding run's task id, or None if unknown).
"""

from __future__ import annotations

import logging
from typing import Any

from celery.bootsteps import RUN
from celery.signals import task_revoked, worker_process_shutdown, worker_shutdown
from celery.utils.dispatch import Signal

from .exceptions import LockError
from .heartbeat import heartbeat

log = logging.getLogger("celery_singleton_lock.task")

#: A task run took its lock; the body is about to run.
lock_acquired = Signal(name="lock_acquired")
#: A task run found its lock taken and did not run its body (``lock_conflict="skip"``).
lock_skipped = Signal(name="lock_skipped")
#: A task run's lock was found lost while the body ran (also logged at WARNING).
lock_lost = Signal(name="lock_lost")
#: A task run released its lock (or handed it to its retry).
lock_released = Signal(name="lock_released")


def release_all_held(**_: Any) -> None:
    """Release every lease this process still holds: at worker (process) shutdown, so a
    stopping worker frees its keys at once rather than after the lease runs out."""
    for lease in heartbeat().leases():
        try:
            lease.release()
        except LockError as exc:
            log.warning("could not release %r at shutdown: %s", lease.name, exc)


def _release_at_worker_shutdown(sender: Any = None, **_: Any) -> None:
    """``worker_shutdown``: release what this process still holds, unless the worker's steps
    (its pool among them) are still running. Celery sends the signal after stopping them,
    except from ``stop(in_sighandler=True)`` on a pool that is not signal-safe (threads,
    gevent, eventlet), where the pool's tasks run on and still need their locks."""
    blueprint = getattr(sender, "blueprint", None)
    if getattr(blueprint, "state", None) == RUN:
        log.debug("worker_shutdown while the pool still runs: nothing released")
        return
    release_all_held()


def free_revoked_claim(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A message revoked (or expired) before it ran never takes its claim over: free the
    claim now rather than after its countdown plus ``lock_ttl``, so new calls are not
    deduplicated to a task that will never run. A run already under way holds its own lock,
    not the claim, so a revoke with ``terminate=True`` frees nothing here."""
    free_claim = getattr(sender, "free_claim", None)
    if free_claim is None or request is None or not getattr(request, "id", None):
        return
    try:
        freed = free_claim(
            request.args or (),
            request.kwargs or {},
            task_id=request.id,
            attempt=int(request.retries or 0),
        )
    except LockError as exc:
        log.warning("could not free the claim of revoked %s[%s]: %s", sender.name, request.id, exc)
        return
    if freed:
        log.info("freed the claim of revoked %s[%s]", sender.name, request.id)


task_revoked.connect(free_revoked_claim, weak=False)
worker_process_shutdown.connect(release_all_held, weak=False)
worker_shutdown.connect(_release_at_worker_shutdown, weak=False)
