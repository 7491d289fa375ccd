"""The error tree. Every error raised by this package is a :class:`LockError`."""

from __future__ import annotations

from typing import Any


class LockError(Exception):
    """Root of every error raised by ``celery_singleton_lock``.

    ``name`` is the lock name the error is about, when there is one.
    """

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class ConfigurationError(LockError, ValueError):
    """A bad argument or setting; raised before any Redis call.

    ``argument`` names the argument or setting that was wrong.
    """

    def __init__(self, argument: str, message: str | None = None, *, name: str | None = None):
        # One-argument form: rebuilt from its message (Celery result backends do that).
        if message is None:
            argument, _, message = argument.partition(": ")
        super().__init__(f"{argument}: {message}", name=name)
        self.argument = argument


class LockTimeout(LockError):
    """The lock could not be taken within the allowed wait."""


class LockNotHeld(LockError):
    """An operation that needs a held lock was called on one that was never acquired,
    was already released, or belongs to another process (after ``fork``)."""


class LockLost(LockError):
    """The lease is no longer ours: it expired or another owner holds the name.

    Subclasses tell the two cases apart; ``reason`` is ``"expired"``, ``"taken"``,
    ``"unreachable"`` (Redis did not answer before the lease ran out) or ``"max_hold"``.
    """

    reason = "lost"


class LockExpired(LockLost):
    """The lease ran out (or Redis lost it) and nobody else holds the name now."""

    reason = "expired"


class LockTaken(LockLost):
    """The lease ran out and another owner holds the name now."""

    reason = "taken"


class LockBackendError(LockError):
    """Redis is unreachable or answered with an error. The message names the server
    (its URL without the password)."""


class KeyLayoutError(LockError):
    """The keys under the client's prefix are laid out by another release of the package: the
    key layout version recorded there for ``kind`` (``found``) is not the one this process
    writes (``expected``). Raised by a connection's first lock operation, before it touches a
    lock (core/layout.py); not a :class:`LockBackendError`, so no wait rides it out."""

    def __init__(self, message: str, *, kind: str = "", found: str = "", expected: str = ""):
        super().__init__(message)
        self.kind = kind
        self.found = found
        self.expected = expected


class LockNotReplicated(LockBackendError):
    """A client made with ``replicas`` N > 0: the script ran on the master, but fewer than N
    replicas acknowledged its write in time (``WAIT``). An acquire is undone before this is
    raised (nothing is held); a release or hand-over did happen on the master, but a
    failover to a replica that missed it could bring the old hold back until its ttl runs
    out; an upgrade, downgrade or shrink done on the master is the handle's state before
    this is raised. ``acknowledged``: how many replicas did; ``replies``: the scripts'
    replies."""

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        replies: list[Any] | None = None,
        acknowledged: int = 0,
    ) -> None:
        super().__init__(message, name=name)
        self.replies = replies or []
        self.acknowledged = acknowledged


class DuplicateTask(LockError):
    """``apply_async`` refused a duplicate of a task whose lock is taken (``lock_on_enqueue``
    with ``lock_conflict="raise"``). ``task_id`` is the holder's task id, when known."""

    def __init__(self, message: str, *, name: str | None = None, task_id: str | None = None):
        super().__init__(message, name=name)
        self.task_id = task_id
