"""Enqueue-time locking (``lock_on_enqueue``): a claim per queued call, taken in
``apply_async`` before the message is sent (claims.py: what a claim is, its whole life).

With ``lock_on_enqueue=True`` the claim is on the run's own lock name and the worker that
runs the message takes it over, so the key stays locked from enqueue to the end of the run.
With ``lock_on_enqueue="until_start"`` the claim is on a name of its own (:func:`queue_name`)
and the run frees it as it starts: at most one call waits in the queue, beside the one that
may be running, and the run then takes its run-time lock as any run does. With
``lock_on_enqueue="debounce"`` a new call takes the queue claim over from the queued one
(owner-checked, atomic) and is sent too; the replaced message, when it runs, finds its claim
gone and is skipped in favour of the latest. No message is withdrawn from the broker, so
nothing depends on a revoke reaching a worker in time.

A call is always sent, whatever the claim, when it is a retry or a replacement sent by the
running task under its own task id (it continues a call that was let through already) or part
of a canvas (dropping it would drop the rest of the chain, group or chord): its run-time lock
decides then."""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from celery.result import AsyncResult
from celery.utils import uuid

from ..exceptions import DuplicateTask, LockBackendError, LockError, LockNotReplicated
from . import holders
from .claims import claim_lease, claim_life, claim_name, finished_claim
from .options import DEBOUNCE

log = logging.getLogger("celery_singleton_lock.task")

#: Options that make a message part of a canvas: callbacks, the rest of a chain, a chord's
#: body, or membership of a group.
_CANVAS_OPTIONS = ("link", "link_error", "chain", "chord", "group_id")


def continues_running_call(task: Any, task_id: str | None) -> bool:
    """True for a message the running task sends under its own task id: the retry
    ``Task.retry`` sends, or the replacement ``Task.replace`` sends. Either continues a call
    that was let through already: its lock was handed over to it, or it takes one when it
    runs; deduplicating it against the running call itself would lose it."""
    return task_id is not None and task_id == task.request.id


def send_once(
    task: Any,
    send: Callable[..., Any],
    args: Any,
    kwargs: Any,
    task_id: str | None,
    options: dict[str, Any],
) -> Any:
    """``apply_async`` of ``task`` under its enqueue-time lock: claim, then ``send`` (Celery's
    own ``apply_async``); a duplicate gets the holder's ``AsyncResult`` (or DuplicateTask)."""
    lock = task.lock_options
    UNSENT.release()
    task_id = task_id or uuid()
    name = claim_name(task, args, kwargs)
    ttl = claim_life(seconds_until(options.get("eta"), options.get("countdown")), lock.queue_ttl)
    claim = claim_lease(task, name, task_id, ttl)
    claimed = claim.acquire(0)
    if not claimed:
        found = holders.holders_of(claim)
        stale = finished_claim(task, found)
        if stale is None and lock.on_enqueue == DEBOUNCE:
            stale = next((holder for holder in found if holders.claimed(holder)), None)
        if stale is not None:
            # Its task finished or was revoked without running it (or without freeing it):
            # take the claim over, only if it is still that one (owner-checked, atomic).
            claim = claim_lease(task, name, task_id, ttl, takeover=stale.owner)
            claimed = claim.acquire(0)
            if claimed:
                log.info("%s[%s] took over the claim of %s", task.name, task_id, stale.task_id)
            else:
                found = holders.holders_of(claim)
    if claimed:
        try:
            return send(args, kwargs, task_id=task_id, **options)
        except BaseException:
            release_unsent(task, claim, task_id, ttl)
            raise
    why = holders.describe(found)
    if any(options.get(key) for key in _CANVAS_OPTIONS):
        log.info(
            "%s[%s] sent despite lock %r (%s): part of a canvas", task.name, task_id, name, why
        )
        return send(args, kwargs, task_id=task_id, **options)
    holder = next((holder.task_id for holder in found if holder.task_id), None)
    if lock.conflict == "raise":
        raise DuplicateTask(
            f"{task.name}: a call with lock {name!r} is queued or running ({why})",
            name=name,
            task_id=holder,
        )
    log.info("%s not sent: lock %r %s", task.name, name, why)
    if holder is None:
        return send(args, kwargs, task_id=task_id, **options)
    return AsyncResult(holder, app=task.app)


def release_unsent(task: Any, claim: Any, task_id: str, ttl: float) -> None:
    """Release the claim of a call whose message was not sent (no message carries it). When
    the lock Redis does not answer either (the broker is often the same Redis), the send's
    error is the one the caller gets, and the claim is released by this process's next
    enqueue-time call (:data:`UNSENT`): until then, or until it runs out, calls of that key
    are answered with this task id, never sent."""
    if not UNSENT.released(claim):
        log.warning(
            "%s[%s] was not sent and its claim on %r could not be released: calls with that"
            " lock get this task id until this process's next call releases it, or it runs"
            " out in %.0f s",
            task.name, task_id, claim.name, ttl,
        )  # fmt: skip
        UNSENT.add(claim, ttl)


class UnsentClaims:
    """Claims of calls whose message was not sent and whose release the lock Redis did not
    answer. Each later enqueue-time call of the process releases them first (a round trip
    only while one is left, at most one try a second), until each is released, gone or run
    out: a Redis that comes back stops deduplicating calls against a message never sent at
    the next call, not after the claim's whole life. Nothing if the process ends first."""

    #: Seconds between two tries while the lock Redis still does not answer.
    RETRY_S = 1.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims: list[tuple[Any, float]] = []  # (claim, monotonic time it runs out)
        self._next_try = 0.0

    def add(self, claim: Any, ttl: float) -> None:
        with self._lock:
            self._claims.append((claim, time.monotonic() + ttl))
            self._next_try = 0.0  # tried at the next call

    def release(self) -> None:
        """Try to release every claim left (no I/O when there is none)."""
        if not self._claims or time.monotonic() < self._next_try:
            return
        with self._lock:
            claims, self._claims = self._claims, []
            self._next_try = time.monotonic() + self.RETRY_S
        now = time.monotonic()
        left = [(c, until) for c, until in claims if until > now and not self.released(c)]
        with self._lock:
            self._claims.extend(left)

    @staticmethod
    def released(claim: Any) -> bool:
        """Release ``claim``: False if the lock Redis did not answer (it keeps its owner token
        for another try); True if it is released or gone (run out, cleared)."""
        try:
            claim.release()
        except LockNotReplicated:
            pass  # released on the master
        except LockBackendError:
            return False
        except LockError:
            pass  # gone already: nothing holds the key
        return True


#: The process's claims left by calls not sent.
UNSENT = UnsentClaims()


def seconds_until(eta: datetime.datetime | str | None, countdown: float | None) -> float:
    """Seconds until a message with this ``eta`` or ``countdown`` may run (0: at once)."""
    if countdown is not None:
        return max(0.0, float(countdown))
    if isinstance(eta, str):
        eta = datetime.datetime.fromisoformat(eta)
    if eta is not None:
        now = datetime.datetime.now(eta.tzinfo)
        return max(0.0, (eta - now).total_seconds())
    return 0.0
