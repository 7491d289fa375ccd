"""What Celery knows about lock holders: the workers' tasks, the result backend, the queues.

Checks for :func:`celery_singleton_lock.admin.list_locks`, used by ``celery locks``. They only
restate locks the heartbeat left undecided (live with a fresh heartbeat, or no heartbeat) and
claims (listed ``queued``), whose holder recorded a task id; a question Celery cannot answer
leaves the lock as it was.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection
from typing import Any

from ..admin import CLAIMED, LIVE, NO_EVIDENCE, QUEUED, STALE, Check, LockInfo
from . import broker_queues
from .claims import FINISHED_STATES, has_result_backend, result_state

log = logging.getLogger("celery_singleton_lock.admin")

#: Evidence of a lock whose holder's own worker answered without the holder's task.
NOT_ACTIVE = "not active on its worker"
#: Evidence of a claim whose message is in none of the Redis broker's queues, not received by
#: a worker, and on no worker that answered.
NOT_QUEUED = "not queued: in no queue of the broker, on no worker"
#: A claim younger than this (seconds, server time) is never judged not queued: it is taken
#: (or handed over on retry) just before its message is sent, which may still be on its way.
IN_FLIGHT_S = 5.0
__all__ = [
    "FINISHED_STATES", "IN_FLIGHT_S", "NOT_ACTIVE", "NOT_QUEUED", "backend_check",
    "queue_check", "worker_check",
]  # fmt: skip


def worker_check(app: Any, *, timeout: float) -> Check:
    """Ask the workers (``inspect().active()``, waiting ``timeout`` s for replies) which
    tasks run now. A holder's task that runs on some worker is ``live``.

    Only the holder's own worker node (recorded by SingletonTask as ``worker``) can say its
    task is not running: a lock without a heartbeat whose node answered without the task is
    ``stale``. A node that did not answer (busy, like a solo worker running that very task,
    or slow) is no evidence, nor is any other worker's answer, even on the same host; and a
    fresh heartbeat always wins, so a lock that has one is never made stale here."""

    def check(infos: list[LockInfo]) -> list[LockInfo]:
        asking = [info for info in infos if info.undecided and info.task_id]
        if not asking or timeout <= 0:
            return infos
        try:
            replies = app.control.inspect(timeout=timeout).active() or {}
        except Exception as exc:  # broker unreachable: no evidence either way
            log.warning("could not ask the workers which tasks are active: %s", exc)
            return infos
        running = {str(task.get("id")): node for node, ts in replies.items() for task in ts or ()}
        out = []
        for info in infos:
            if info.undecided and info.task_id:
                if info.task_id in running:
                    info = info.restated(LIVE, f"active on worker {running[info.task_id]}")
                elif info.evidence == NO_EVIDENCE and info.worker in replies:
                    info = info.restated(STALE, f"{NOT_ACTIVE} {info.worker}")
            out.append(info)
        return out

    return check


def backend_check(app: Any) -> Check | None:
    """Ask the result backend for the task state of each holder without a heartbeat, and of
    each claim: finished, failed or revoked means ``stale`` (a queued message's task that is
    over will never take its claim over). A fresh heartbeat always wins: some process still
    renews that lock, whatever an earlier run under the same task id stored. None when the
    app has no result backend."""
    if not has_result_backend(app, log):
        return None

    def check(infos: list[LockInfo]) -> list[LockInfo]:
        out = []
        for info in infos:
            if (
                info.state in (LIVE, QUEUED)
                and info.evidence in (NO_EVIDENCE, CLAIMED)
                and info.task_id
            ):
                state = result_state(app, info.task_id, log)
                if state is not None:
                    info = dataclasses.replace(info, task_state=state)
                if state in FINISHED_STATES:
                    info = info.restated(STALE, f"result backend: {state}")
            out.append(info)
        return out

    return check


def queue_check(app: Any, *, timeout: float, purged: bool = False) -> Check:
    """Say where the message of each claim listed ``queued`` is, and make ``stale`` a claim
    whose message is known to be queued no more (purged, lost by the broker).

    Found on a worker (``inspect().query_task``, waiting ``timeout`` s; its ``reserved``,
    ``scheduled`` or ``active`` requests), in a queue of a Redis broker or received by a
    worker from it (broker_queues.py): ``queued``, saying where. Found nowhere, on a Redis
    broker that was read: ``stale`` (:data:`NOT_QUEUED`). A broker that cannot be read
    without consuming (RabbitMQ, SQS) says nothing; there, only with ``purged`` (the operator
    states that the queues were purged) and when at least one worker answered, a claim no
    answering worker has is ``stale``. A claim younger than :data:`IN_FLIGHT_S` is left
    ``queued``: its message may still be on its way to the broker."""

    def check(infos: list[LockInfo]) -> list[LockInfo]:
        asking = {info.task_id for info in infos if info.state == QUEUED and info.task_id}
        if not asking:
            return infos
        on_workers, answered = _on_workers(app, asking, timeout)
        in_broker = broker_queues.locate(app, asking - on_workers.keys())
        out = []
        for info in infos:
            if info.state == QUEUED and info.task_id:
                info = _placed(info, on_workers, in_broker, answered if purged else 0)
            out.append(info)
        return out

    return check


def _on_workers(app: Any, task_ids: Collection[str], timeout: float) -> tuple[dict[str, str], int]:
    """task id -> "reserved/scheduled/active on worker NODE" for the ones a worker has, and
    how many workers answered within ``timeout`` s (0 when not asked)."""
    if timeout <= 0:
        return {}, 0
    try:
        replies = app.control.inspect(timeout=timeout).query_task(*task_ids) or {}
    except Exception as exc:  # broker unreachable: no evidence either way
        log.warning("could not ask the workers which tasks they hold: %s", exc)
        return {}, 0
    held: dict[str, str] = {}
    answered = 0
    for node, tasks in replies.items():
        if not isinstance(tasks, dict):  # an error reply says nothing of its requests
            continue
        answered += 1
        for task_id, found in tasks.items():
            state = found[0] if isinstance(found, (list, tuple)) and found else "held"
            held[str(task_id)] = f"{state} on worker {node}"
    return held, answered


def _placed(
    info: LockInfo, on_workers: dict[str, str], in_broker: dict[str, str] | None, answered: int
) -> LockInfo:
    """A claim restated with where its message is, or stale if that is known to be nowhere."""
    assert info.task_id is not None
    state = f"; result backend: {info.task_state}" if info.task_state else ""
    where = on_workers.get(info.task_id) or (in_broker or {}).get(info.task_id)
    if where:
        return info.restated(QUEUED, where + state)
    if info.age_s is None or info.age_s < IN_FLIGHT_S:
        return info.restated(QUEUED, CLAIMED + state)
    if in_broker is not None:
        return info.restated(STALE, NOT_QUEUED + state)
    if answered:
        return info.restated(
            STALE, f"queues purged, on none of the {answered} worker(s) that answered" + state
        )
    return info.restated(QUEUED, CLAIMED + state)
