"""Objects whose threads and locks a forked child must make anew.

A child process has only the thread that forked: a lock another thread held at the fork stays
held in it for good, and the threads an object started are not there. Such an object calls
:func:`reset_in_child` once it exists, and its ``_reset_after_fork`` runs in every child.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class ResetAfterFork(Protocol):
    def _reset_after_fork(self) -> None:
        """Make anew, in the child, what the parent's other threads may hold or run."""


_objects: weakref.WeakSet[ResetAfterFork] = weakref.WeakSet()


def reset_in_child(obj: ResetAfterFork) -> None:
    """Have ``obj._reset_after_fork()`` run in each child forked while ``obj`` lives."""
    _objects.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_objects):
        obj._reset_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
