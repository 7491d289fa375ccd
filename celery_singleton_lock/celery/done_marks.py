"""The mark a call leaves when an attempt of it ends, so that a copy of its message that comes
later (a visibility timeout, a worker that lost its broker connection) never runs the body
again.

When a run's body has ended (returned, raised, or called ``retry``), the run writes
``P{T}:done:<task id>`` (in its lock's Cluster slot; for a multi-key lock, its first name's;
the task id escaped, core/keys.py ``key_part``, as the caller or broker chose it), a hash
holding, per send of that task id (sends.py: a replacement or a re-send under the same task id
is another send, a retry the same one), the highest attempt (``request.retries``) that ended,
with an expiry (:func:`mark_ttl`). It is written BEFORE the lock is freed, in the SAME script
call as the release (the two scripts joined into one: the mark first, then the release), so no
copy can take the freed lock without finding the mark. Every acquire of a run reads the mark in
the same script call as its attempt, after it; a delivery whose attempt is at or below the one
that ended is a copy of a call that ended: it gives back what it took and is dropped without
running the body (as a copy of a finished original is, with ``Ignore``). A message with no send
id (sent by another client) delivered again is a copy of any send of its task id that ended;
delivered once, on a broker that marks redeliveries, it is a new send (sends.py
``unmarked_is_new``) and runs whatever ended before.

A body that did not end (the process SIGKILLed, a hard time limit, ``SystemExit``, a body
that raised ``Ignore`` or ``Reject`` itself: ``Task.replace`` hands the very task id on) writes
no mark: its message, redelivered, runs again. A retry's attempt N is marked once the retry
message is sent (a lock handed over to attempt N+1 keeps attempt N's copies out until then),
and a run that never got its lock (skipped, ``lock_conflict="raise"`` or ``"retry"``) is marked
as it ends, so a copy of an attempt that retried does not run beside the retry.

A mark is written where a copy of the message can still come after its run ended
(:func:`copies_can_come`: ``acks_late``, an eta or countdown, a delivery that is itself a copy
or was re-queued; every call with ``singleton_lock_done_marks = "always"``), and where a copy
did come while the run held its lock: every acquire notes its delivery in the mark's hash, in
the same script call, and the run's end drops its own note and records the attempt if another
delivery's note is there (that copy, re-queued behind its original, comes back later). A call
acknowledged as it starts, with no eta and no copy, leaves nothing once it ended.

The mark is advisory, like the wait mark: a lost mark (a failover, an expiry) lets a copy run
as it did before. Only task runs pay for it (a few commands in the acquire's and the release's
script calls, no call of its own); the lock primitives never touch it.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import Any

from ..core import validate
from ..core.connection import Connection
from ..core.handle import LockHandle
from ..core.keys import data_key
from ..core.replication import Replication
from ..core.scripts import Script, ScriptCall, bound_to, register, source
from ..exceptions import LockBackendError
from . import own_holds, sends
from .options import DONE_MARK_TTL_SETTING, DONE_MARKS_SETTING, check_done_mark_ttl
from .sends import NO_SEND

log = logging.getLogger("celery_singleton_lock.task")

#: Kombu's Redis and SQS transports deliver an unacknowledged message again after this
#: many seconds unless ``broker_transport_options["visibility_timeout"]`` says otherwise.
DEFAULT_VISIBILITY_TIMEOUT_S = 3600.0
#: A done mark lasts this many visibility timeouts: a copy restored once the timeout passed
#: may still wait in the queue, or be re-queued behind its original (own_holds.py) for up to
#: half a timeout, before it runs.
VISIBILITY_TIMEOUTS = 2.0
#: The attribute of a task's request that keeps its delivery's id (:func:`delivery_id`).
DELIVERY_ATTRIBUTE = "singleton_lock_delivery"
#: What :func:`read_ended` answers when no attempt ended.
NONE_ENDED = -1


class DoneScripts:
    """The done mark's script registered on one Redis client (no I/O)."""

    def __init__(self, redis: Any, replication: Replication | None = None) -> None:
        # Advisory, as the wait mark: joined to the lock's own script calls, whose WAIT
        # covers it where the client waits for replicas.
        self.mark: Script = register(redis, source("done_mark"))


def scripts(connection: Connection) -> DoneScripts:
    """The done mark's scripts of ``connection``, registered on first use."""
    return bound_to(connection, DoneScripts)


def mark_ttl(app: Any) -> float:
    """Seconds a done mark lasts: the ``singleton_lock_done_mark_ttl`` setting, else
    :data:`VISIBILITY_TIMEOUTS` times the broker's visibility timeout (default one hour,
    so two hours); 0 when the setting turns marks off. Raises ConfigurationError for a
    setting that is not a number of seconds >= 0."""
    conf = app.conf
    value = conf.get(DONE_MARK_TTL_SETTING, None)
    if value is not None:
        return check_done_mark_ttl(value)
    timeout = own_holds.visibility_timeout(app) or DEFAULT_VISIBILITY_TIMEOUT_S
    return VISIBILITY_TIMEOUTS * timeout


def copies_can_come(task: Any, request: Any) -> bool:
    """Whether a copy of the message ``request`` runs from can still come after this run
    ended, so that the run writes its done mark. A message acknowledged as its run starts
    (Celery's default) comes back only if it was restored before that: one that waited for
    an eta or countdown (Redis and SQS restore it after their visibility timeout, RabbitMQ's
    consumer timeout closes the channel), or was itself delivered again or re-queued (then
    other copies of it may be out). ``acks_late`` messages come back after a crash past the
    release. A worker's prefetched message that waited past the visibility timeout is the one
    copy this cannot see: ``singleton_lock_done_marks = "always"`` covers it."""
    if task.app.conf.get(DONE_MARKS_SETTING, None) == "always":
        return True
    if getattr(request, "is_eager", False):
        return False
    if task.acks_late or request.eta is not None:
        return True
    return sends.redelivered(request) or sends.requeued(request)


def delivery_id(request: Any) -> str:
    """An id of the delivery ``request`` runs (kept on the request, so every mark call of
    the run notes the same one): random, as no broker's delivery tag is unique across
    workers."""
    found = getattr(request, DELIVERY_ATTRIBUTE, None)
    if found is None:
        found = secrets.token_hex(6)
        setattr(request, DELIVERY_ATTRIBUTE, found)
    return str(found)


@dataclass(frozen=True)
class DoneMark:
    """The done mark of attempt ``attempt`` of one send of a task id: its key, its expiry
    (ms), the send id (sends.NO_SEND: a message that carries none), the id of the delivery
    that reads and writes it ('' none: it notes nothing) and whether a copy of that delivery's
    message can come later (:func:`copies_can_come`: then its end is always recorded, else
    only when another delivery noted itself while it ran)."""

    key: bytes
    attempt: int
    ttl_ms: int
    send: str = NO_SEND
    delivery: str = ""
    copies_can_come: bool = True

    @classmethod
    def of(
        cls,
        connection: Connection,
        handle: LockHandle,
        task_id: str,
        attempt: int,
        ttl: float,
        send: str = NO_SEND,
        delivery: str = "",
        copies_can_come: bool = True,
    ) -> DoneMark:
        """The mark of attempt ``attempt`` of send ``send`` of ``task_id``, in the slot of
        ``handle``'s name (a multi-key lock: its first name), lasting ``ttl`` seconds."""
        key = key_beside(connection, handle, "done", task_id)
        ttl_ms = validate.seconds_to_ms(ttl)
        return cls(key, attempt, ttl_ms, send, delivery, copies_can_come)

    def set_call(self, connection: Connection) -> ScriptCall:
        always = "1" if self.copies_can_come else ""
        args = [self.attempt, self.ttl_ms, self.send, self.delivery, always]
        return (scripts(connection).mark, [self.key], args)

    def get_call(self, connection: Connection) -> ScriptCall:
        return (scripts(connection).mark, [self.key], ["", self.ttl_ms, self.send, self.delivery])


def acquire(
    connection: Connection, handle: LockHandle, wait: float, mark: DoneMark
) -> tuple[bool, int]:
    """``handle.acquire(wait)``, each of its attempts followed, in its script call, by a read
    of ``mark``: whether it took the lock, and the highest attempt of the task id that had
    ended as its last attempt ran (:data:`NONE_ENDED` if none)."""
    read: list[Any] = []
    taken = handle.acquire_along(mark.get_call(connection), read, wait)
    return taken, int(read[-1]) if read else NONE_ENDED


def release(connection: Connection, handle: LockHandle, delay: float, mark: DoneMark) -> None:
    """``handle.release(delay)``, with ``mark`` written first in the same script call; raises
    as ``release`` does. A release that needs no round trip (the handle holds nothing) still
    writes the mark, alone."""
    sent: list[Any] = []
    try:
        handle.release_along(mark.set_call(connection), sent, delay)
    finally:
        if not sent:
            record(connection, mark)


def record(connection: Connection, mark: DoneMark) -> None:
    """Write ``mark`` in a round trip of its own (no lock to free with it). A failure is only
    logged: without the mark a later copy may run again, as it did before marks."""
    try:
        connection.do(mark.set_call(connection))
    except LockBackendError as exc:
        log.warning("could not write the done mark %r: %s", mark.key, exc)


def read_ended(connection: Connection, mark: DoneMark) -> int:
    """The highest attempt of ``mark``'s task id that ended (:data:`NONE_ENDED` if none)."""
    return int(connection.do(mark.get_call(connection)))


def key_beside(connection: Connection, handle: LockHandle, kind: str, *parts: str | int) -> bytes:
    """A key of the Celery layer's own (a wait or done mark) of ``kind`` about ``parts``
    (a task id, an attempt) in the Cluster slot of ``handle``'s lock: its name's, a multi-key
    lock's first name's. The parts are data (a task id is whatever the caller or broker
    chose): :func:`..core.keys.data_key` escapes them, so no task id makes the mark's key
    look like a lock's to a listing."""
    names = getattr(handle, "names", None)
    name = names[0] if names else handle.name
    return data_key(connection.keys(name).base, kind, *parts)
