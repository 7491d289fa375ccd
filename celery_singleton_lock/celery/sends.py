"""What "the same call" means to the task layer: a *send*, not a task id.

Celery reuses a task id for things that are not copies of one message: ``Task.replace`` sends
the replacement under the replaced task's id, and ``apply_async(task_id=...)`` (a common
idempotency pattern) sends a call again under an id that ran before. Only a broker's
redelivery (a visibility timeout, ``acks_late`` after a worker died, RabbitMQ's requeue of an
unacked message) and this package's own re-queue of a copy (own_holds.py) deliver one message
twice.

So :meth:`SingletonTask.apply_async` stamps every message it sends with a send id of its own,
in the :data:`SEND_HEADER` message header, which every copy of that message carries. A retry
continues its call: Celery builds the retry from the running request, headers included, so it
keeps the send id and counts its attempt in ``request.retries``. A call is then (send id,
attempt): done marks (done_marks.py), copies and take-overs of holds (own_holds.py) key on it.

A message sent by another client (``send_task`` from a process without the task class, a
task converted by ``singleton_lock_tasks`` in the worker only) carries no send id. Where the
broker marks what it delivers again (:func:`unmarked_is_new`: Redis and RabbitMQ set
``redelivered``; this package counts its own re-queues in a header), such a message that
carries no mark is a new send of its task id, not a copy: a re-send under a used task id
runs. On another broker (SQS redelivers with no mark) the task id stands for the send, as
every send of that task id might be its original.

The other headers this package reads from a message live here too: the counts of its own
re-queues of a copy (own_holds.py), and the call identity its shared holds are taken under.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..core.keys import key_part

#: The message header holding a message's send id (:func:`new_send_id`).
SEND_HEADER = "singleton_lock_send"
#: The send id of a message that carries none: the task id stands for the send.
NO_SEND = ""
#: The message header counting how often a copy was re-queued behind a live original.
REQUEUES_HEADER = "singleton_lock_requeues"
#: The message header counting how often a copy was re-queued because its attempt had ended
#: with no outcome stored yet (done_marks.py): the copy runs once that count is one.
OUTCOME_REQUEUES_HEADER = "singleton_lock_outcome_requeues"
#: Every re-queue count a re-queued message carries on.
REQUEUE_HEADERS = (REQUEUES_HEADER, OUTCOME_REQUEUES_HEADER)


def new_send_id() -> str:
    """A fresh send id: 64 random bits in hex, unique among the sends of one task id."""
    return uuid.uuid4().hex[:16]


def message_header(request: Any, name: str) -> Any:
    """The value of message header ``name`` of ``request``'s message (None if it has none):
    Celery puts a message's custom headers on the request, or, by protocol and pool, in
    ``request.headers``."""
    value = getattr(request, name, None)
    if value is None and isinstance(getattr(request, "headers", None), dict):
        value = request.headers.get(name)
    return value


def send_of(request: Any) -> str:
    """The send id the message of ``request`` carries (:data:`NO_SEND` if none)."""
    value = message_header(request, SEND_HEADER)
    return str(value) if value else NO_SEND


#: The kombu transports (``Connection.transport_cls``) whose redeliveries carry the
#: ``redelivered`` mark: Redis's and the virtual transports' restore sets it, AMQP brokers set it
#: on a message requeued after its consumer went.
MARKING_TRANSPORTS = frozenset(
    ("redis", "rediss", "sentinel", "amqp", "amqps", "pyamqp", "librabbitmq", "memory",
     "filesystem")
)  # fmt: skip


def redelivered(request: Any) -> bool:
    """Whether the broker says it delivered the message of ``request`` before."""
    delivery = getattr(request, "delivery_info", None) or {}
    return bool(delivery.get("redelivered"))


def marks_redeliveries(app: Any) -> bool:
    """Whether ``app``'s broker transport marks a message it delivers again (no I/O)."""
    connection = app.connection_for_read()
    try:
        return str(connection.transport_cls) in MARKING_TRANSPORTS
    finally:
        connection.release()


def unmarked_is_new(request: Any, marks: bool) -> bool:
    """Whether the message of ``request`` is a new send of its task id though it carries no
    send id: its broker marks redeliveries (``marks``, :func:`marks_redeliveries`) and
    neither the broker nor this package marked this one as delivered again."""
    return (
        marks and send_of(request) == NO_SEND and not redelivered(request) and not requeued(request)
    )


def stamp(options: dict[str, Any]) -> dict[str, Any]:
    """``apply_async`` options with a send id in their headers, the caller's other headers
    kept: a new one, unless the options carry one already (a retry built from its running
    request continues that send)."""
    headers = dict(options.get("headers") or {})
    headers[SEND_HEADER] = headers.get(SEND_HEADER) or new_send_id()
    return {**options, "headers": headers}


def unstamped(options: dict[str, Any]) -> dict[str, Any]:
    """``apply_async`` options without a send id: the message is a new send."""
    headers = options.get("headers")
    if not isinstance(headers, dict) or SEND_HEADER not in headers:
        return options
    return {**options, "headers": {k: v for k, v in headers.items() if k != SEND_HEADER}}


def same_call(task_id: str | None, send: str | None, request: Any) -> bool:
    """Whether a hold recorded by task id ``task_id`` and send id ``send`` belongs to the call
    of ``request``: the same task id and, where both carry one, the same send id. A
    replacement or a re-send under the same task id is another call; a hold or a message
    with no send id is matched by task id alone."""
    if task_id != request.id:
        return False
    mine = send_of(request)
    return not send or not mine or send == mine


def call_identity(request: Any) -> str:
    """The call identity (``call``, see ``kinds.intervals.check_call``) the run of
    ``request`` takes its shared holds under (read, upgradable, range, semaphore permit):
    Redis refuses such a hold, in the acquire's own script call, while a hold of the same
    identity stands, and the run then meets that hold as its own (run_model.py).

    The task id and the send (sends.py): every delivery and every attempt of one send share
    it, so a copy is never let in beside its original, whatever their attempts; a
    replacement or a re-send under the same task id is another call. The one place that
    says which string names a call."""
    send = send_of(request)
    # The task id escaped (no ':' left in it), so no id can spell another call's identity.
    return f"{key_part(request.id)}:{send}" if send else key_part(request.id)


def requeues(request: Any, header: str = REQUEUES_HEADER) -> int:
    """How often the message of ``request`` was re-queued behind a live original (or, by
    ``header``, for another reason)."""
    count = message_header(request, header)
    try:
        return int(count or 0)
    except (TypeError, ValueError):
        return 0


def requeued(request: Any) -> bool:
    """Whether the message of ``request`` was re-queued, for whatever reason."""
    return any(requeues(request, header) for header in REQUEUE_HEADERS)
