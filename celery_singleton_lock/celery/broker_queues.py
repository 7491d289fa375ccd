"""Where task messages wait in a Redis broker, read without consuming anything.

Kombu's Redis transport keeps each queue as a list (one list per priority step: the queue's
name, then the name, ``\\x06\\x16`` and the step), each message a JSON object whose
``headers.id`` is the task id (task protocol 2). A message a worker has received but not yet
acknowledged (prefetched, or held until its countdown or eta) sits in the hash ``unacked``
(transport option ``unacked_key``) as ``[message, exchange, routing key]`` until the worker
acknowledges it as the task starts, or restores it to its queue. Every key carries the
transport option ``global_keyprefix``.

The queues are found by type (SCAN ... TYPE list), not by the app's configuration, so a
message sent to a queue of its own (``apply_async(queue=...)``) is found too; each list is
read in pages (LRANGE) until every task id asked about was found, and an id is reported
missing only when two reads in a row missed it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from ..core import redis_urls
from .options import broker_redis

log = logging.getLogger("celery_singleton_lock.admin")

#: What a broker read says of a task id it did not find in a queue, but as received by a
#: worker that has not acknowledged it yet.
DELIVERED = "delivered to a worker, not yet acknowledged"
#: Messages read per LRANGE, and keys per SCAN step.
PAGE = 500
#: Kombu's separator between a queue's name and its priority step.
PRIORITY_SEP = b"\x06\x16"


def locate(app: Any, task_ids: Iterable[str]) -> dict[str, str] | None:
    """Where each of ``task_ids`` waits in the app's broker: ``"in queue NAME"``, or
    :data:`DELIVERED`; ids found nowhere are left out. None when the broker is not Redis
    (or is a Redis Cluster) or cannot be read: no evidence either way."""
    wanted = set(task_ids)
    found = broker_redis(app.conf)
    if found is None or not wanted:
        return None
    url, kwargs = found
    options = app.conf.get("broker_transport_options", None) or {}
    if options.get("ack_emulation", True) is False:
        return None  # a received message is then nowhere in the broker to be seen
    prefix = str(options.get("global_keyprefix", "") or "")
    unacked = prefix + str(options.get("unacked_key", "unacked") or "unacked")
    try:
        client = redis_urls.connect(
            url, **{"socket_connect_timeout": 5, "socket_timeout": 10, **kwargs}
        )
    except ValueError as exc:
        log.warning("cannot read the broker's queues: %s", exc)
        return None
    if redis_urls.is_cluster(client):
        client.close()
        return None
    try:
        where = _read(client, wanted, prefix.encode(), unacked)
        if wanted - where.keys():
            # A message restored to its queue (a worker's shutdown, a visibility timeout)
            # while the first pass read the hash after its list is seen by a second one.
            where.update(_read(client, wanted - where.keys(), prefix.encode(), unacked))
        return where
    except Exception as exc:  # an unreadable broker is no evidence
        log.warning("cannot read the broker's queues: %s", exc)
        return None
    finally:
        client.close()


def _read(client: Any, wanted: set[str], prefix: bytes, unacked: str) -> dict[str, str]:
    where: dict[str, str] = {}
    # The queues first, then the messages received meanwhile: a message moves from its list
    # to the unacknowledged hash, so read in this order it is seen in one place or the other.
    for key in client.scan_iter(match=prefix + b"*" if prefix else None, count=PAGE, _type="list"):
        if not wanted - where.keys():
            break
        queue = key[len(prefix) :].partition(PRIORITY_SEP)[0].decode("utf-8", "replace")
        start = 0
        while wanted - where.keys():
            page = client.lrange(key, start, start + PAGE - 1)
            for raw in page:
                task_id = _task_id(raw)
                if task_id in wanted:
                    where.setdefault(task_id, f"in queue {queue}")
            if len(page) < PAGE:
                break
            start += PAGE
    if wanted - where.keys():
        for raw in client.hvals(unacked):
            try:
                message = json.loads(raw)[0]
            except (ValueError, TypeError, LookupError):
                continue
            task_id = _task_id(message)
            if task_id in wanted:
                where.setdefault(task_id, DELIVERED)
    return where


def _task_id(message: Any) -> str | None:
    """``headers.id`` of a message (JSON text, or already decoded), None if it has none."""
    if isinstance(message, (bytes, str)):
        try:
            message = json.loads(message)
        except ValueError:
            return None
    headers = message.get("headers") if isinstance(message, dict) else None
    task_id = headers.get("id") if isinstance(headers, dict) else None
    return task_id if isinstance(task_id, str) else None
