"""Our signals (the worker's receivers of Celery's signals live in worker.py).

Each of our signals is sent with the task as sender and the keyword arguments ``name``
(the lock name), ``task_id`` and ``hold`` (the run's lock handle, of whatever kind: lease,
read/write or range hold, multi-key lease, semaphore permit; None for ``lock_skipped``).
``lock_acquired`` and ``lock_skipped`` also carry ``wait`` (seconds the run waited for its
lock), and ``lock_skipped`` carries ``holder`` (the holding run's task id, or None if unknown).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.utils.dispatch import Signal

log = logging.getLogger("celery_singleton_lock.task")


class LockSignal(Signal):  # type: ignore[misc]
    """A Celery signal that is not sent when no receiver would act on it.

    A receiver connected with :meth:`connect_checked` comes with a test, ``acts(sender,
    **named)``, that says whether a send would make it do anything (the task-event receivers:
    only when the run sends task events). A send goes out when any receiver has no such test
    (anyone's ``connect``: it always gets its send) or its test says it acts; else it costs a
    look at the receivers, not Celery's ``Signal.send``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # id(receiver) -> (receiver, its test); the receiver is kept so that its id is not
        # reused. By id: a weak receiver's entry is a weakref, which may not hash once dead.
        self._acts: dict[int, tuple[Any, Callable[..., bool]]] = {}

    def connect_checked(self, receiver: Callable[..., Any], acts: Callable[..., bool]) -> None:
        """Connect ``receiver`` (for any sender, strongly referenced), with ``acts``."""
        self._acts[id(receiver)] = (receiver, acts)
        self.connect(receiver, weak=False)

    def is_checked(self, receiver: Any) -> bool:
        """Whether ``receiver`` (a ``receivers`` entry's) came with a test."""
        return id(receiver) in self._acts

    def would_act(self, sender: Any, **named: Any) -> bool:
        """Whether sending with these arguments could make any receiver do something."""
        acts = self._acts
        for entry in self.receivers:
            checked = acts.get(id(entry[1]))
            if checked is None or checked[1](sender, **named):
                return True
        return False

    def send(self, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
        if not self.would_act(sender, **named):
            return []
        return super().send(sender, **named)  # type: ignore[no-any-return]


#: A task run took its lock; the body is about to run.
lock_acquired = LockSignal(name="lock_acquired")
#: A task run found its lock taken and did not run its body (``lock_conflict="skip"``).
lock_skipped = LockSignal(name="lock_skipped")
#: A task run's lock was found lost while the body ran (also logged at WARNING).
lock_lost = LockSignal(name="lock_lost")
#: A task run released its lock (or handed it to its retry).
lock_released = LockSignal(name="lock_released")
