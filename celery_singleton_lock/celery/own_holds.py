"""A run that finds its lock held under its own task id: is that hold dead, its own, or a
live original?

A message meets a hold of its own task id when a broker delivers it again (``acks_late``
after a worker died, a visibility timeout) while the delivery it copies still holds the
lock, when an earlier attempt's acquire took the lock but its reply was lost, or when an
earlier attempt's enqueue claim was never taken over. Ignoring every such copy loses the call
whenever the hold is left over, so a delivered message either runs or is *provably* a
duplicate of a live run:

- a hold of an EARLIER attempt (a run or a claim, ``request.retries`` below this one's): that
  attempt ended before this one was sent, so nothing runs under it: take it over;
- a hold of a LATER attempt: the call goes on in that attempt; this message is obsolete:
  ignore it;
- a hold of the SAME attempt whose holder is dead (its heartbeat overdue on the Redis clock,
  by the admin's staleness rule; or its process, of this worker node and host, provably gone:
  recorded in this boot and pid namespace, and no process with that pid and start time runs
  now, core/pid_evidence.py): take it over. A pid of another pid namespace or boot proves
  nothing (a worker of the same node name in another container of this host name);
- a hold of the same attempt whose holder may be alive: a live original. This delivery is
  re-queued (same task id and attempt, no enqueue claim, the user's retries untouched) to
  look again once the holder's heartbeat could be overdue, and ignored. A re-queued copy
  whose task the result backend shows finished is dropped; otherwise it runs once the
  original's hold is gone or dead.

Shared holds (read, upgradable, read ranges, semaphore permits) would let a copy in beside
its original, so a run takes them under its :func:`call_identity`: Redis refuses such a hold
while one of the same call stands, in the acquire's own script call (``held_by_call``), and
the run meets that hold here as it meets its own exclusive lease held.

A take-over replaces exactly the owner token that was read (owner-checked, atomic), so a
holder that changed meanwhile is not touched. :func:`decide` holds the rules, without I/O;
the rest reads the hold and acts on the verdict.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import Task
from celery.exceptions import Reject

from ..admin.inspect import MISSED_TICKS, TICKS_PER_TTL, escape, heartbeat_stopped, server_ms
from ..core.holder import HOSTNAME
from ..core.pid_evidence import GONE, ProcessMark, judge, look, this_process
from ..exceptions import LockBackendError
from ..kinds.lease import CLAIM_OWNER_PREFIX, Lease
from ..kinds.lease_listing import list_holders
from .claims import FINISHED_STATES, claim_owner, has_result_backend, result_state
from .sends import (
    REQUEUE_HEADERS,
    REQUEUES_HEADER,
    SEND_HEADER,
    requeues,
    same_call,
    send_of,
)

log = logging.getLogger("celery_singleton_lock.task")


TAKE_OVER, IGNORE, REQUEUE = "take over", "ignore", "requeue"

#: Added to the time until a holder's heartbeat is overdue: the heartbeat's own tick.
MARGIN_S = 1.0


@dataclass(frozen=True)
class OwnHold:
    """The hold of a lock under a run's own task id, as Redis has it."""

    owner: str
    #: The attempt (``request.retries``) that holds it; None if the holder did not say.
    attempt: int | None
    #: Held for a queued message (a claim), not by a process.
    claimed: bool
    #: Its heartbeat is overdue (the admin's "stale"), on the Redis server's clock.
    stale: bool
    #: Seconds until its heartbeat is overdue, if it is renewed no more.
    overdue_in: float
    #: Its lease length in seconds (None if unknown).
    lease: float | None
    host: str | None
    pid: int | None
    #: Where and when ``pid`` names the holder (``pid_evidence.ProcessMark`` as stored).
    proc: str | None
    worker: str | None


@dataclass(frozen=True)
class Verdict:
    """What a run does about a hold of its own task id (:data:`TAKE_OVER`, :data:`IGNORE` or
    :data:`REQUEUE` with ``countdown`` seconds), and why, for the log."""

    action: str
    why: str
    countdown: float = 0.0
    #: The message header that counts this re-queue.
    counted_in: str = REQUEUES_HEADER


def decide(
    hold: OwnHold,
    *,
    attempt: int,
    node: str | None,
    process: Callable[[int | None, str | None], str],
    requeues: int = 0,
    max_countdown: float | None = None,
) -> Verdict:
    """The verdict on ``hold`` for attempt ``attempt`` of the same task id, running on worker
    ``node`` of this host; ``process`` says whether the holder's process is alive, gone or
    unknown here (:func:`process_state`); ``requeues``: how often this copy was re-queued
    already; ``max_countdown``: the longest a re-queued copy may wait (see
    :func:`max_countdown`)."""
    if hold.attempt is not None and hold.attempt < attempt:
        what = "claim" if hold.claimed else "hold"
        return Verdict(TAKE_OVER, f"took over the {what} of earlier attempt {hold.attempt}")
    if hold.attempt is not None and hold.attempt > attempt:
        return Verdict(IGNORE, f"obsolete: attempt {hold.attempt} of this task holds the lock")
    if hold.claimed:
        return Verdict(TAKE_OVER, "took over the claim of its own attempt")
    if hold.stale:
        return Verdict(TAKE_OVER, "took over the hold of a dead earlier delivery (heartbeat)")
    if left_by_dead_process(
        hold.worker, hold.host, hold.pid, hold.proc, node=node, process=process
    ):
        return Verdict(TAKE_OVER, f"took over the hold of a dead earlier delivery (pid {hold.pid})")
    base = max(hold.overdue_in, 0.0) + MARGIN_S
    cap = max(base, hold.lease or 0.0)
    countdown = min(base * 2 ** min(requeues, 16), cap)
    if max_countdown is not None:
        countdown = min(countdown, max_countdown)
    where = hold.worker or hold.host or "an unknown worker"
    return Verdict(REQUEUE, f"re-queued: a live copy of this task id runs on {where}", countdown)


def after_delay_in(task: Any, until_ms: int) -> float:
    """The countdown of a copy of ``task`` that is to run its call again (its attempt ended,
    no outcome of it was stored: done_marks.py) but meets that call's own release delay,
    ending at ``until_ms`` on the Redis server's clock: it looks again once the delay is
    over (:func:`look_again_in`)."""
    try:
        left = max(0.0, until_ms - server_ms(task.lock_client)) / 1000
    except LockBackendError:
        left = task.lock_options.lease  # Redis did not answer: not long, look again
    return look_again_in(task, left)


def look_again_in(task: Any, seconds: float) -> float:
    """The countdown of a copy of ``task`` re-queued to look again once ``seconds`` have
    passed: those and a margin, within :func:`max_countdown`."""
    countdown = seconds + MARGIN_S
    cap = max_countdown(task.app)
    return countdown if cap is None else min(countdown, cap)


def process_state(pid: int | None, proc: str | None) -> str:
    """Whether the process ``pid`` that recorded mark ``proc`` (a holder's ``proc`` field) is
    alive, gone or unknown to this process: ``pid_evidence.judge`` on this machine. Only a
    record of this boot and this pid namespace can be gone; this process itself is alive."""
    return judge(pid, ProcessMark.parse(proc), this_process(), look)


def left_by_dead_process(
    worker: str | None,
    host: str | None,
    pid: int | None,
    proc: str | None,
    *,
    node: str | None,
    process: Callable[[int | None, str | None], str] = process_state,
) -> bool:
    """Whether a record made by worker ``worker`` on ``host`` in process ``pid`` marked
    ``proc`` (a hold, a wait mark) was left by a process of worker ``node`` on this host
    that is provably gone (``process`` says :data:`GONE`). A record of another pid namespace
    or boot, or without a mark, proves nothing: a worker of the same node name may run it
    in another container of this host name (and a threads pool's copies run side by side
    in the asking process itself, which is alive)."""
    return node is not None and worker == node and host == HOSTNAME and process(pid, proc) == GONE


# -- reading the hold --------------------------------------------------------------------------


def read_own_hold(lease: Lease, client: Any, request: Any) -> OwnHold | None:
    """The hold of ``lease``'s name if its holder record is of the call of ``request`` (its
    task id and send, sends.same_call) and is not a release delay, else None. Two round
    trips: the conflict path only."""
    records = list_holders(client, escape(lease.name))
    now_ms = server_ms(client)
    task_id = request.id
    for record in records:
        owner = record.owner
        if not owner or not same_call(record.task_id, record.send, request):
            continue
        claimed = owner.startswith(CLAIM_OWNER_PREFIX)
        renewed, ttl = record.renewed_ms, record.ttl_ms
        overdue_at = None
        if renewed is not None and ttl:
            overdue_at = renewed + ttl * MISSED_TICKS / TICKS_PER_TTL
        # The admin's staleness rule, for a holder whose heartbeat renews it.
        beats = record.heartbeat == 1 and not claimed and renewed is not None
        return OwnHold(
            owner=owner,
            attempt=_claim_attempt(owner, task_id) if claimed else _int(record.attempt),
            claimed=claimed,
            stale=beats and heartbeat_stopped(now_ms, renewed or 0, ttl),
            overdue_in=0.0 if overdue_at is None else max(0.0, overdue_at - now_ms) / 1000,
            lease=None if not ttl else ttl / 1000,
            host=record.host,
            pid=record.pid,
            proc=record.proc,
            worker=record.worker,
        )
    return None


def assess(task: Any, lease: Lease, node: str | None) -> tuple[OwnHold | None, Verdict | None]:
    """The hold of ``lease``'s name under the running ``task``'s own task id, and the verdict
    on it for this run on worker ``node``; (None, None) if there is none (a release delay of
    this call, or let go meanwhile). A hold that cannot be read is looked at again soon."""
    request = task.request
    try:
        hold = read_own_hold(lease, task.lock_client, request)
    except LockBackendError as exc:
        return None, Verdict(REQUEUE, f"re-queued: its own hold could not be read ({exc})", 1.0)
    if hold is None:
        return None, None
    verdict = decide(
        hold,
        attempt=request.retries or 0,
        node=node,
        process=process_state,
        requeues=requeues(request),
        max_countdown=max_countdown(task.app),
    )
    return hold, verdict


def _claim_attempt(owner: str, task_id: str) -> int | None:
    """The attempt of claim token ``owner`` (claims.claim_owner: ``claim:<task id>:<n>``)."""
    head = claim_owner(task_id, 0)[:-1]
    return _int(owner[len(head) :]) if owner.startswith(head) else None


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


# -- re-queued copies --------------------------------------------------------------------------


def finished(task: Any, task_id: str) -> str | None:
    """The finished state (SUCCESS, FAILURE, REVOKED) the result backend has for ``task_id``,
    None if it has none, or there is no backend to ask."""
    if not has_result_backend(task):
        return None
    state = result_state(task, task_id)
    return state if state in FINISHED_STATES else None


def visibility_timeout(app: Any) -> float | None:
    """The broker's visibility timeout in seconds (``broker_transport_options``: Redis, SQS),
    after which an unacknowledged message is delivered again; None if the app sets none."""
    options = app.conf.get("broker_transport_options") or {}
    timeout = options.get("visibility_timeout") if isinstance(options, dict) else None
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        return None
    return float(timeout)


def max_countdown(app: Any) -> float | None:
    """The longest countdown a re-queued copy may get: under half the broker's visibility
    timeout (Redis, SQS), which otherwise delivers a message that waits for its countdown
    a second time, and each copy would then re-queue itself again. None if there is none."""
    timeout = visibility_timeout(app)
    return None if timeout is None else max(0.1, timeout / 2)


def requeue(task: Any, countdown: float, counted_in: str = REQUEUES_HEADER) -> None:
    """Send the running message of ``task`` again, ``countdown`` seconds from now: the same
    task id, arguments, attempt and canvas options, no enqueue claim (Celery's own
    ``apply_async``), one more re-queue counted in header ``counted_in``. Raises Reject (back
    to the broker) if it could not be sent."""
    request = task.request
    # Only our headers: the request's own may carry the message's eta, which would win over
    # the countdown.
    headers: dict[str, Any] = {header: requeues(request, header) for header in REQUEUE_HEADERS}
    headers[counted_in] += 1
    send = send_of(request)
    if send:
        headers[SEND_HEADER] = send  # the same message again: the same send
    signature = task.signature_from_request(
        request, countdown=countdown, retries=request.retries or 0, headers=headers
    )
    options = dict(signature.options)
    try:
        Task.apply_async(task, signature.args, signature.kwargs, **options)
    except Exception as exc:
        log.error("%s[%s] could not be re-queued: %s", task.name, request.id, exc)
        raise Reject(exc, requeue=True) from exc
