"""What Celery knows about lock holders: the workers' active tasks and the result backend.

Checks for :func:`celery_singleton_lock.admin.list_locks`, used by ``celery locks``. They only
restate locks the heartbeat left undecided (live with a fresh heartbeat, or no heartbeat) and
whose holder recorded a task id; a question Celery cannot answer leaves the lock live.
"""

from __future__ import annotations

import logging
from typing import Any

from ..admin import CLAIMED, LIVE, NO_EVIDENCE, QUEUED, STALE, Check, LockInfo
from .claims import FINISHED_STATES

log = logging.getLogger("celery_singleton_lock.admin")

#: Evidence of a lock whose holder's own worker answered without the holder's task.
NOT_ACTIVE = "not active on its worker"
__all__ = ["FINISHED_STATES", "NOT_ACTIVE", "backend_check", "worker_check"]


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
        running: dict[str, str] = {}
        for node, tasks in replies.items():
            for task in tasks or ():
                running[str(task.get("id"))] = node
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
    from celery.backends.base import DisabledBackend

    try:
        if isinstance(app.backend, DisabledBackend):
            return None
    except Exception as exc:  # a misconfigured backend: no evidence from it
        log.warning("result backend unusable: %s", exc)
        return None

    def check(infos: list[LockInfo]) -> list[LockInfo]:
        out = []
        for info in infos:
            if (
                info.state in (LIVE, QUEUED)
                and info.evidence in (NO_EVIDENCE, CLAIMED)
                and info.task_id
            ):
                try:
                    state = app.AsyncResult(info.task_id).state
                except Exception as exc:
                    log.warning("result backend did not answer for %s: %s", info.task_id, exc)
                    state = None
                if state in FINISHED_STATES:
                    info = info.restated(STALE, f"result backend: {state}")
            out.append(info)
        return out

    return check
