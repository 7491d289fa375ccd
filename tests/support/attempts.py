"""One round trip of a sync handle's operations, run on its own: a single acquire attempt
as a given owner token, or one change of an interval hold, without the waiting around it."""

from __future__ import annotations

from typing import Any

from celery_singleton_lock.core.handle import LockHandle


def try_acquire(handle: LockHandle, owner: str, reserve: bool) -> tuple[bool, int]:
    """One acquire attempt of ``handle`` as ``owner`` (``reserve``: as a waiter makes it):
    (True, fencing token) or (False, ms a waiter would sleep). The handle's state is not
    changed: it does not hold what the attempt took."""
    return handle._run(handle._try_acquire(owner, reserve))


def change(handle: Any, op: str, **arguments: Any) -> tuple[int, int]:
    """One interval_change.lua call of the interval hold ``handle`` (held): its reply."""
    code, value, _ = handle._run(handle._change(op, **arguments))
    return code, value
