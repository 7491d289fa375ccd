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
message of an older version of the app) carries no send id: for it the task id stands for the
send, as every send of that task id might be its original.
"""

from __future__ import annotations

import uuid
from typing import Any

#: The message header holding a message's send id (:func:`new_send_id`).
SEND_HEADER = "singleton_lock_send"
#: The send id of a message that carries none: the task id stands for the send.
NO_SEND = ""


def new_send_id() -> str:
    """A fresh send id: 64 random bits in hex, unique among the sends of one task id."""
    return uuid.uuid4().hex[:16]


def send_of(request: Any) -> str:
    """The send id the message of ``request`` carries (:data:`NO_SEND` if none)."""
    value = getattr(request, SEND_HEADER, None)
    if value is None and isinstance(getattr(request, "headers", None), dict):
        value = request.headers.get(SEND_HEADER)
    return str(value) if value else NO_SEND


def stamp(options: dict[str, Any], send: str | None = None) -> dict[str, Any]:
    """``apply_async`` options with the send id ``send`` (None: a new one) in their headers,
    the caller's other headers kept. A message whose options carry a send id already keeps
    it when ``send`` is None: a retry built from its running request continues that send."""
    headers = dict(options.get("headers") or {})
    if send is None:
        send = headers.get(SEND_HEADER) or new_send_id()
    headers[SEND_HEADER] = send
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
