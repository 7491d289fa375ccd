"""The mark a delivery leaves while it waits for its lock, so that a copy of the same message
(same task id and attempt) re-queues itself rather than wait behind it and run a second time.

A copy that meets its original's *hold* is handled by own_holds.py; a copy that arrives while
its original still waits for a lock another call holds finds no hold of its own task id. So a
delivery about to wait (``lock_wait``, the first try failed) claims, in one ``SET NX PX``, the
key ``P{T}:waiting:<task id>:<attempt>`` (in the lock's Cluster slot; for a multi-key lock,
its first name's; the task id escaped, core/keys.py ``key_part``) with
``<worker>|<pid>|<host>|<nonce>|<proc>`` (``proc``: where and when the pid names that process,
core/pid_evidence.py), and deletes it, owner-checked, when
the wait ends however it ends. A delivery that finds the mark is a copy of a waiting original:
it is re-queued (own_holds.requeue) and ignored. The mark expires by itself a margin after the
wait would end, so a delivery killed while waiting blocks its copies no longer than that; a
copy on the same worker node and host whose waiting process is provably gone (the mark was
made in this boot and pid namespace, and no process of that pid and start time runs) takes the
mark over at once (owner-checked).

Only the waiting path pays for this (two round trips around a wait); an uncontended run never
touches the mark.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any

from ..core.connection import Connection
from ..core.handle import LockHandle
from ..core.holder import HOSTNAME
from ..core.pid_evidence import this_process_text
from ..core.replication import Replication
from ..core.scripts import Script, bound_to, register, source
from ..exceptions import LockBackendError
from . import done_marks, own_holds

log = logging.getLogger("celery_singleton_lock.task")

#: Added to the wait in the mark's expiry: the round trips around the wait, and a slow start.
MARK_MARGIN_S = 5.0
#: The longest wait a mark covers (``lock_wait=math.inf`` included): nothing renews a mark,
#: so a delivery killed while waiting keeps its copies on other nodes re-queued for this long
#: at most; a wait longer than this is no longer marked past it.
MARK_LONGEST_WAIT_S = 3600.0


class MarkScripts:
    """The wait mark's scripts registered on one Redis client (no I/O)."""

    def __init__(self, redis: Any, replication: Replication | None = None) -> None:
        # The mark is advisory (it only spares a copy's wait): no replica need have it.
        self.claim: Script = register(redis, source("wait_mark_claim"))
        self.replace: Script = register(redis, source("wait_mark_replace"))


def scripts(connection: Connection) -> MarkScripts:
    """The wait mark's scripts of ``connection``, registered on first use."""
    return bound_to(connection, MarkScripts)


@dataclass(frozen=True)
class WaitingDelivery:
    """Who a mark says waits: the worker node, process and host of that delivery, and where
    and when that pid names it (``pid_evidence.ProcessMark`` as stored; None in a mark of an
    older version)."""

    worker: str | None
    pid: int | None
    host: str | None
    proc: str | None = None

    @classmethod
    def parse(cls, value: Any) -> WaitingDelivery:
        text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        worker, pid, host, _nonce, proc = ([*text.split("|"), "", "", "", "", ""])[:5]
        try:
            pid_number: int | None = int(pid)
        except ValueError:
            pid_number = None
        return cls(worker or None, pid_number, host or None, proc or None)


@dataclass(frozen=True)
class Mark:
    """A mark this delivery holds: its key and the exact value it wrote."""

    key: bytes
    value: str


class CopyOfWaiting(Exception):
    """Another delivery of this message waits for the lock (``waiting``); re-queue in
    ``countdown`` seconds."""

    def __init__(self, waiting: WaitingDelivery, countdown: float) -> None:
        super().__init__(waiting, countdown)
        self.waiting = waiting
        self.countdown = countdown

    def verdict(self) -> own_holds.Verdict:
        where = self.waiting.worker or self.waiting.host or "an unknown worker"
        why = f"re-queued: a copy of this task id waits for the lock on {where}"
        return own_holds.Verdict(own_holds.REQUEUE, why, self.countdown)


def mark_key(connection: Connection, handle: LockHandle, task_id: str, attempt: int) -> bytes:
    """The mark's key: in the Cluster slot of ``handle``'s name (a multi-key lock: its first
    name)."""
    return done_marks.key_beside(connection, handle, "waiting", task_id, attempt)


def requeue_countdown(remaining_s: float, requeues: int, max_countdown: float | None) -> float:
    """How long a copy of a waiting delivery stays away: growing from
    :data:`own_holds.MARGIN_S` with each re-queue, no longer than the mark may still stand
    (plus that margin), nor than ``max_countdown`` (half the visibility timeout)."""
    base = own_holds.MARGIN_S
    countdown = min(base * 2.0 ** min(requeues, 16), max(remaining_s, 0.0) + base)
    if max_countdown is not None:
        countdown = min(countdown, max_countdown)
    return countdown


def claim(
    connection: Connection,
    key: bytes,
    *,
    wait: float,
    node: str | None,
    requeues: int,
    max_countdown: float | None,
) -> Mark:
    """Claim the mark ``key`` for a wait of ``wait`` seconds by this process on worker
    ``node``. Raises :class:`CopyOfWaiting` if another live delivery holds it; takes over,
    owner-checked, a mark of this node and host whose process is provably gone. One round
    trip, and a second only to take a dead delivery's mark over."""
    # The process mark last: what a mark of an older version has comes first, as it was.
    proc = this_process_text() or ""
    value = f"{node or ''}|{os.getpid()}|{HOSTNAME}|{uuid.uuid4().hex}|{proc}"
    ttl_ms = int((min(wait, MARK_LONGEST_WAIT_S) + MARK_MARGIN_S) * 1000)
    marks = scripts(connection)
    claimed, *found_pttl = connection.do((marks.claim, [key], [value, ttl_ms]))
    found, pttl = found_pttl or (None, 0)
    if claimed or found == value.encode():
        # The second answer is a claim sent again (redis-py's retry after a lost reply)
        # finding the mark its first send set.
        return Mark(key, value)
    waiting = WaitingDelivery.parse(found or b"")
    dead = own_holds.left_by_dead_process(
        waiting.worker, waiting.host, waiting.pid, waiting.proc, node=node
    )
    if dead and connection.do((marks.replace, [key], [found, value, ttl_ms])):
        log.warning("took over the wait mark %r of a dead delivery (pid %s)", key, waiting.pid)
        return Mark(key, value)
    remaining = pttl / 1000 if isinstance(pttl, int) and pttl > 0 else 0.0
    raise CopyOfWaiting(waiting, requeue_countdown(remaining, requeues, max_countdown))


def remove(connection: Connection, mark: Mark) -> None:
    """Delete ``mark`` if it is still this delivery's. A failure is only logged: the mark
    expires by itself."""
    try:
        connection.do((scripts(connection).replace, [mark.key], [mark.value, "", 0]))
    except LockBackendError as exc:
        log.warning("could not remove the wait mark %r (it expires by itself): %s", mark.key, exc)
