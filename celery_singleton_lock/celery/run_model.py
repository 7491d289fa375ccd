"""The run of a task as observe → decide → act: every rule of what a delivery does, in one
pure function over what was observed of it.

:class:`Snapshot` holds what the run knows: the request and the options (set once), and what it
observed so far (None: not observed yet). :func:`decide` looks at a snapshot and answers one
:class:`Action`: either an observation to make next (``ACQUIRE``, ``READ_FINISHED``,
``READ_OUTCOME``, ``READ_HOLDS``, ``READ_OWN_HOLD``, ``LEAVE_QUEUE``), a step that acts and
observes its own outcome (``TAKE_OVER``, ``WAIT``), or how the delivery ends (``RUN`` and the
rest). The task (task.py) runs that loop: it makes the observation or the step, records it in
the snapshot, and asks again, until the answer ends the delivery. No rule lives in the loop,
and no I/O here: every row of the table is tested without Redis (tests/tasks/test_run_model.py), and
the table is written once more, for users, in docs/run-semantics.md.

The order of the rules is the order of the table: a lock Redis that did not answer first,
then a re-queued copy whose original finished, the queue claim a call leaves, the acquire and
the done mark read with it, a hold of this very call, the wait, and the conflict.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import own_holds, sends

#: Observations and steps: decide() asks for them, the task makes them.
ACQUIRE = "acquire"
READ_FINISHED = "read finished"
READ_OUTCOME = "read outcome"
READ_HOLDS = "read holds"
READ_OWN_HOLD = "read own hold"
LEAVE_QUEUE = "leave queue"
TAKE_OVER = "take over"
WAIT = "wait"
#: How a delivery ends.
RUN = "run"
RUN_UNLOCKED = "run unlocked"
FAIL = "fail"
SKIP = "skip"
REPLACED = "replaced"
CONFLICT_RAISE = "conflict raise"
CONFLICT_RETRY = "conflict retry"
REQUEUE = "requeue"
DROP = "drop"

ENDS = frozenset(
    (RUN, RUN_UNLOCKED, FAIL, SKIP, REPLACED, CONFLICT_RAISE, CONFLICT_RETRY, REQUEUE, DROP)
)

#: When a re-queued copy looks again (``Action.look_again``): the countdown given, once a
#: dead holder's lease could have run out, or once this call's release delay is over.
GIVEN, AFTER_LEASE, AFTER_DELAY = "given", "after lease", "after delay"


@dataclass(frozen=True)
class Action:
    """What the run does next: ``kind`` (one of the constants above) and, where it says,
    why (for the log); for a re-queue, when it looks again (``look_again``, ``countdown``)
    and the header counting it."""

    kind: str
    why: str = ""
    countdown: float = 0.0
    counted_in: str = sends.REQUEUES_HEADER
    look_again: str = GIVEN


@dataclass(slots=True)
class Snapshot:
    """What one delivery of a task message knows when it decides. The first group is set as
    the run starts; the rest is observed (None: not yet), recorded by the task as it
    observes (decide() only reads a snapshot)."""

    #: ``request.retries``.
    attempt: int
    #: ``lock_wait`` (0: none), ``lock_conflict``, ``lock_backend_down``.
    wait: float = 0.0
    conflict: str = "skip"
    backend_down: str = "fail"
    #: An exclusive lease: a hold of this call can be taken over (the other kinds re-queue).
    takes_over: bool = True
    #: Re-queued by this package: behind a live original, or for a missing outcome.
    requeued: bool = False
    #: Re-queued for a missing outcome once already: a copy that is to run its call again.
    outcome_requeued: bool = False
    #: The message carries no send id and no mark of a delivery again, on a broker that
    #: marks them (sends.unmarked_is_new): a new send of its task id, whatever of it ended.
    new_send: bool = False
    #: ``until_start``/``debounce`` and the acquire cannot free the queue claim itself (a
    #: Redis Cluster, a kind with no claims): the run leaves the queue first.
    leaves_queue_first: bool = False

    #: The lock Redis did not answer (its error, for the message).
    backend_error: str | None = None
    #: For a re-queued copy: the finished state (SUCCESS, FAILURE, REVOKED) the result backend
    #: has for the task ("" if none: not finished, or no backend to ask).
    finished: str | None = None
    #: The call left the queue (False: a later call replaced it, ``debounce``).
    left_queue: bool | None = None
    #: The lock was taken by the last acquire (or take-over, or wait).
    acquired: bool | None = None
    #: ``debounce``: the acquire found a later call holding the queue claim and did not try.
    replaced_at_acquire: bool = False
    #: A shared hold (read, upgradable, range, permit) was refused in the acquire's own
    #: script call: a live hold of this very call stands (kinds' ``call=``).
    held_by_call: bool = False
    #: The highest attempt of this send that ended, read with the last acquire (-1: none).
    ended: int = -1
    #: The result backend has no outcome of this call (nothing, PENDING, STARTED).
    outcome_missing: bool | None = None
    #: The holders in the way were read: whether one is this call, and the end (server ms)
    #: of this call's own release delay, if it left one.
    holds_read: bool = False
    own_hold: bool = False
    own_delay_until_ms: int | None = None
    #: For an exclusive lease, once read: the verdict on this call's hold (own_holds.decide),
    #: None when no hold of this call stands but its release delay or one that changed hands.
    own_assessed: bool = False
    own_verdict: own_holds.Verdict | None = None
    #: The take-over's acquire took the lock (False: the hold changed hands meanwhile).
    took_over: bool | None = None
    #: The wait ran; or another delivery of this message waits already (its verdict).
    waited: bool = False
    copy_waiting: own_holds.Verdict | None = None

    @property
    def attempt_ended(self) -> bool:
        """The done mark read with the last acquire says this attempt of this send (or a
        later one) ended already; never for a new send, whatever of its task id ended."""
        return self.ended >= self.attempt and not self.new_send


def decide(s: Snapshot) -> Action:
    """The next action of the run that knows ``s``."""
    if s.backend_error is not None:
        return Action(RUN_UNLOCKED if s.backend_down == "run" else FAIL, s.backend_error)
    if s.requeued and s.finished is None:
        return Action(READ_FINISHED)
    if s.requeued and s.finished:
        return Action(DROP, f"dropped: the original run ended ({s.finished})")
    if s.leaves_queue_first and s.left_queue is None:
        return Action(LEAVE_QUEUE)
    if s.left_queue is not False and s.acquired is None:
        return Action(ACQUIRE)
    if s.acquired is not None:
        ended = _ended(s)
        if ended is not None:
            return ended
    if s.acquired:
        if s.attempt_ended:
            return Action(RUN, f"runs again: attempt {s.ended} of this task id ended, but no "
                          "outcome of it was stored (its worker stopped in between)")  # fmt: skip
        return Action(RUN)
    if not s.holds_read:
        return Action(READ_HOLDS)
    if (s.left_queue is False or s.replaced_at_acquire) and not s.own_hold:
        # Replaced in the queue (debounce). A hold of this very call means it left the queue
        # and started before a later call queued: a copy of a started call, which the own
        # hold's rules below decide (take a dead original's hold over, or look again).
        return Action(REPLACED)
    if (s.own_hold or s.held_by_call) and s.took_over is None:
        return _own_hold(s)
    if s.took_over is False:
        return _changed_hands(s)
    if s.wait and not s.waited:
        return Action(WAIT)
    if s.copy_waiting is not None:
        return _requeue(s.copy_waiting)
    if s.conflict == "raise":
        return Action(CONFLICT_RAISE)
    if s.conflict == "retry":
        return Action(CONFLICT_RETRY)
    return Action(SKIP)


def _ended(s: Snapshot) -> Action | None:
    """The done mark (done_marks.py): an attempt of this send at or past this one ended
    (:attr:`Snapshot.attempt_ended`). The delivery is a copy of a call that ended: dropped,
    giving back what it took, unless the call's outcome is missing (its worker stopped between
    release and storing it): then it is re-queued once, and runs if the outcome is still
    missing when it comes back."""
    if not s.attempt_ended:
        return None
    if s.outcome_missing is None:
        return Action(READ_OUTCOME)
    if s.outcome_missing and s.outcome_requeued:
        return None  # runs again
    if s.outcome_missing:
        why = f"re-queued: attempt {s.ended} of this task id ended, its outcome not stored yet"
        return Action(REQUEUE, why, 0.0, sends.OUTCOME_REQUEUES_HEADER, AFTER_LEASE)
    return Action(DROP, f"dropped: attempt {s.ended} of this task id ended already")


def _own_hold(s: Snapshot) -> Action:
    """A hold of this very call stands in the way (own_holds.py)."""
    if s.own_delay_until_ms is not None and s.outcome_requeued and s.outcome_missing is None:
        return Action(READ_OUTCOME)
    if s.own_delay_until_ms is not None and s.outcome_requeued and s.outcome_missing:
        # Its call ended with no outcome stored: run again once the delay is over.
        why = "re-queued: runs again once the release delay of its call that ended is over"
        return Action(REQUEUE, why, 0.0, sends.OUTCOME_REQUEUES_HEADER, AFTER_DELAY)
    if not s.takes_over:
        if s.own_delay_until_ms is not None:
            return Action(DROP, "ignored: a copy of the same task id holds the lock")
        # Nothing to take over: look again once a dead holder's lease could have run out.
        why = "re-queued: a hold of this task id stands"
        return Action(REQUEUE, why, 0.0, sends.REQUEUES_HEADER, AFTER_LEASE)
    if not s.own_assessed:
        return Action(READ_OWN_HOLD)
    verdict = s.own_verdict
    if verdict is None:
        return _changed_hands(s)
    if verdict.action == own_holds.TAKE_OVER:
        return Action(TAKE_OVER, verdict.why)
    return _requeue(verdict)


def _changed_hands(s: Snapshot) -> Action:
    """This call's hold went (let go, or another copy took it over) between the reads: a
    release delay of this call ends the delivery, else look again soon."""
    if s.own_delay_until_ms is not None:
        return Action(DROP, "ignored: a copy of the same task id holds the lock")
    return Action(REQUEUE, "re-queued: its hold changed hands", own_holds.MARGIN_S)


def _requeue(verdict: own_holds.Verdict) -> Action:
    if verdict.action == own_holds.REQUEUE:
        return Action(REQUEUE, verdict.why, verdict.countdown, verdict.counted_in)
    return Action(DROP, f"ignored: {verdict.why}")
