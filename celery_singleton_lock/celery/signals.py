"""Our signals (the worker's receivers of Celery's signals live in worker.py).

Each of our signals is sent with the task as sender and the keyword arguments ``name``
(the lock name), ``task_id`` and ``lease`` (None for ``lock_skipped``). ``lock_acquired`` and
``lock_skipped`` also carry ``wait`` (seconds the run waited for its lock), and
``lock_skipped`` carries ``holder`` (the holding run's task id, or None if unknown).
"""

from __future__ import annotations

import logging

from celery.utils.dispatch import Signal

log = logging.getLogger("celery_singleton_lock.task")

#: A task run took its lock; the body is about to run.
lock_acquired = Signal(name="lock_acquired")
#: A task run found its lock taken and did not run its body (``lock_conflict="skip"``).
lock_skipped = Signal(name="lock_skipped")
#: A task run's lock was found lost while the body ran (also logged at WARNING).
lock_lost = Signal(name="lock_lost")
#: A task run released its lock (or handed it to its retry).
lock_released = Signal(name="lock_released")
