"""Claims: a lock held on behalf of a queued message rather than a running process.

A claim is an ordinary lock hash whose owner token, :func:`claim_owner`, is derived from the
task id and the attempt number (``request.retries``) instead of a process. Its whole life:

1. **Taken at enqueue** (``lock_on_enqueue``, enqueue.py): ``apply_async`` takes a claim for
   attempt 0 before it sends the message (:func:`claim_lease`), under :func:`claim_name`:
   the run's own lock name with ``lock_on_enqueue=True``, or :func:`queue_name` of it with
   ``"until_start"`` and ``"debounce"``. A claim whose task the result backend says is over
   (:func:`finished_claim`), or any queued claim under ``"debounce"``, is taken over,
   owner-checked, by the new call.
2. **Handed over on retry**: ``Task.retry`` turns the run's lock into a claim for the next
   attempt before the retry message is sent (:func:`hand_over`), so no other run of the key
   slips in between; if no retry is sent after all, the claim goes as the run's lock would
   (:func:`release_handed_over`).
3. **Taken over by its run**: the worker that runs exactly that attempt takes the claim over
   as it acquires (:func:`take_over_at_run`; acquire.lua, ARGV[5]). A redelivered copy of the
   same attempt finds the claim already consumed. An ``until_start`` or ``debounce`` run frees
   its queue claim as it starts, in its first acquire's round trip (:func:`free_at_acquire`;
   on a Redis Cluster a call of its own, :func:`free_claim`); a ``debounce`` run whose queue
   claim was taken over by a later call is skipped in favour of it (:func:`replaced_by`).
4. **Freed on revoke**: a message revoked or expired before it ran never takes its claim
   over; the worker's ``task_revoked`` receiver frees it (:func:`free_claim`, via
   ``SingletonTask.free_claim``). A claim that is never run and never freed (a purged or
   lost message) expires by itself: a claim taken at enqueue after the message's countdown
   plus ``lock_queue_ttl``, one handed over on retry after the countdown plus ``lock_ttl``
   (:func:`claim_life`); meanwhile the admin clears the claims of messages no longer queued
   (``celery locks clear --unqueued``, celery/evidence.py).

Only exclusive single-key locks (:class:`Lease`) take claims.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from celery.backends.base import DisabledBackend

from ..core import validate
from ..core.handle import HolderRecord
from ..core.keys import key_part
from ..core.replies import Reply
from ..exceptions import LockError
from ..kinds.lease import CLAIM_OWNER_PREFIX, Lease, ReleaseResult
from .holders import claimed
from .options import DEBOUNCE, UNTIL_START

log = logging.getLogger("celery_singleton_lock.task")

#: Result states after which a task holds nothing any more, and a claim of it is stale.
FINISHED_STATES = ("SUCCESS", "FAILURE", "REVOKED")


def claim_owner(task_id: str, attempt: int) -> str:
    """The owner token of the claim for attempt ``attempt`` (``request.retries``) of a task.
    The task id is escaped as in a key (:func:`..core.keys.key_part`): owner tokens name keys
    (a fair waiter's), so they may carry no hash-tag brace (core/validate.py), and the
    escaped ``:`` keeps the attempt the token's last part, whatever the task id."""
    return f"{CLAIM_OWNER_PREFIX}{key_part(task_id)}:{attempt}"


# -- names -------------------------------------------------------------------------------------


def queue_name(name: str) -> str:
    """The name an ``until_start`` claim for lock ``name`` is held under."""
    return f"{name}#queued"


def claim_name(task: Any, args: Any, kwargs: Any) -> str:
    """The lock name a queued call of ``task`` with these arguments claims."""
    name: str = task.lock_name(args, kwargs)
    return queue_name(name) if task.lock_options.on_enqueue in (UNTIL_START, DEBOUNCE) else name


# -- 1. taken at enqueue -----------------------------------------------------------------------


def claim_life(until_run: float, keep: float) -> float:
    """Seconds a claim lasts: ``until_run`` (the message's countdown or eta) plus ``keep``,
    capped at the longest expiry a lock takes. A claim that runs out never lets two runs of
    a key overlap (the run-time lock decides that); at worst a duplicate is enqueued, so a
    message scheduled further ahead than the cap simply stops deduplicating then."""
    return min(until_run + keep, validate.MAX_SECONDS)


def claim_lease(
    task: Any, name: str, task_id: str, ttl: float, takeover: str | None = None
) -> Lease:
    """The (not yet acquired) claim of attempt 0 of ``task_id`` on ``name``, for ``ttl``
    seconds; with ``takeover``, it replaces the claim of that owner token if still there."""
    claim: Lease = task.lock_client.lease(
        name,
        ttl=ttl,
        heartbeat=False,
        owner_info={"task_name": task.name, "task_id": task_id, "state": "queued"},
        owner=claim_owner(task_id, 0),
        take_over=takeover or None,
    )
    return claim


def has_result_backend(source: Any, logger: logging.Logger = log) -> bool:
    """Whether ``source`` (a task or an app) has a result backend to ask."""
    try:
        return not isinstance(source.backend, DisabledBackend)
    except Exception as exc:  # a misconfigured backend: no evidence from it
        logger.warning("result backend unusable: %s", exc)
        return False


def result_state(source: Any, task_id: str, logger: logging.Logger = log) -> str | None:
    """The state the result backend of ``source`` has for ``task_id``, None if it does not
    answer (no evidence either way).

    Read from the backend, not through an ``AsyncResult``: before Celery 5.7 an
    ``AsyncResult`` that is garbage-collected stops the result consumer's subscription to
    its task id for every other ``AsyncResult`` of that id in the process (celery#4925), so
    a caller waiting on that task (a group's ``get()`` whose member is the claim's holder)
    would never see its result."""
    try:
        return str(source.backend.get_task_meta(task_id)["status"])
    except Exception as exc:
        logger.warning("result backend did not answer for %s: %s", task_id, exc)
        return None


def finished_claim(task: Any, found: Sequence[HolderRecord]) -> HolderRecord | None:
    """The claim among ``found`` whose task the result backend says is over (finished,
    failed or revoked): a message that will never run under it. None if there is none, or
    no result backend to ask."""
    claims = [holder for holder in found if claimed(holder) and holder.task_id]
    if not claims or not has_result_backend(task):
        return None
    for holder in claims:
        if result_state(task, str(holder.task_id)) in FINISHED_STATES:
            return holder
    return None


# -- 2. handed over on retry -------------------------------------------------------------------


def hand_over(task: Any, lease: Lease, task_id: str, attempt: int, ttl: float) -> str:
    """Turn the run's held ``lease`` into the claim of attempt ``attempt`` of ``task_id``,
    held for ``ttl`` seconds; returns the claim's owner token. Raises LockError if the lease
    is lost already or Redis is unreachable."""
    owner = claim_owner(task_id, attempt)
    info = {"task_id": task_id, "task_name": task.name, "state": "retry"}
    lease.hand_over(owner, ttl=min(ttl, validate.MAX_SECONDS), owner_info=info)
    return owner


def release_handed_over(task: Any, name: str, owner: str, delay: float) -> None:
    """Release the claim ``owner`` on ``name`` that :func:`hand_over` made (or may have made:
    its reply lost), after ``delay`` seconds (release delay), as the run's own lock would
    have been: no retry was sent. A claim that cannot be released now is logged and runs
    out by itself; the caller's own error is what it raises."""
    try:
        task.lock_client.release_owner(name, owner, delay=delay)
    except LockError as exc:
        log.warning("%s: could not release the claim %s on %r: %s", task.name, owner, name, exc)


# -- 3. taken over by its run ------------------------------------------------------------------


def take_over_at_run(lease: Lease, task_id: str, attempt: int) -> None:
    """Let the run of attempt ``attempt`` of ``task_id`` take over its claim (taken at
    enqueue or handed over by the previous attempt), if there is one, as ``lease`` acquires."""
    lease.take_over = claim_owner(task_id, attempt)


def free_claim(task: Any, args: Any, kwargs: Any, *, task_id: str, attempt: int) -> ReleaseResult:
    """Free the claim attempt ``attempt`` of task ``task_id`` holds for its queued message, if
    it still holds it: RELEASED, NOT_HELD, or HELD_BY_ANOTHER (another call holds it).

    Attempt 0 is claimed at enqueue (under :func:`claim_name`); a later attempt holds the run
    lock its previous attempt handed over to it (``Task.retry``), whatever ``lock_on_enqueue``.
    """
    options = task.lock_options
    if options.mode != "exclusive" or options.keys is not None or options.range is not None:
        return ReleaseResult.NOT_HELD  # only exclusive single-key locks take claims
    name = claim_name(task, args, kwargs) if attempt == 0 else task.lock_name(args, kwargs)
    return ReleaseResult(task.lock_client.release_owner(name, claim_owner(task_id, attempt)))


def free_at_acquire(lease: Lease, task_id: str, *, stop_if_replaced: bool) -> bool:
    """``until_start``/``debounce``: make the first acquire of ``lease`` (the run lock of an
    attempt of ``task_id``) free attempt 0's queue claim in the same round trip, as
    :func:`free_claim` would, whether or not the lock is then taken. With
    ``stop_if_replaced`` (a ``debounce`` call a later one may replace), a claim another call
    holds stops the acquire (:func:`replaced_at_acquire`). False on a Redis Cluster, where the
    two names' keys are in different slots: use :func:`free_claim`."""
    name = queue_name(lease.name)
    return lease.free_first(name, claim_owner(task_id, 0), stop_if_taken=stop_if_replaced)


def replaced_at_acquire(lease: Lease) -> bool:
    """After an acquire set up by :func:`free_at_acquire` for ``debounce``: whether another
    call held the queue claim (it replaced this one), so the acquire did not try."""
    return lease.freed_first == Reply.TAKEN and not lease.held


def replaced_by(task: Any, args: Any, kwargs: Any) -> str | None:
    """``debounce``: the task id of the call that replaced this one in the queue, if any."""
    found = task.lock_client.holders(claim_name(task, args, kwargs))
    return next((holder.task_id for holder in found if holder.task_id), None)
