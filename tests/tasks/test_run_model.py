"""celery/run_model.py: every row of the run-semantics table (docs/run-semantics.md) as a snapshot
and the action decide() answers, without Redis or a worker; and the whole walk of a run
through its observations, as task.py drives it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from celery_singleton_lock.celery import own_holds
from celery_singleton_lock.celery import run_model as m
from celery_singleton_lock.celery.run_model import Snapshot, decide

S = Snapshot
#: A first attempt that acquired nothing and read the holders in its way (none of its own).
MET = S(attempt=0, acquired=False, holds_read=True)
LIVE = own_holds.Verdict(own_holds.REQUEUE, "re-queued: a live copy of this task id runs", 3.0)
DEAD = own_holds.Verdict(own_holds.TAKE_OVER, "took over the hold of a dead earlier delivery")
LATER = own_holds.Verdict(own_holds.IGNORE, "obsolete: attempt 2 of this task holds the lock")

#: (row of the docs table, snapshot, the action's kind, a part of its why)
ROWS: list[tuple[int, Snapshot, str, str]] = [
    (2, S(attempt=0, acquired=True), m.RUN, ""),
    (3, MET, m.SKIP, ""),
    (4, dataclasses.replace(MET, conflict="raise"), m.CONFLICT_RAISE, ""),
    (5, dataclasses.replace(MET, conflict="retry"), m.CONFLICT_RETRY, ""),
    (6, dataclasses.replace(MET, wait=5.0), m.WAIT, ""),
    (6, dataclasses.replace(MET, wait=5.0, waited=True), m.SKIP, ""),
    (7, dataclasses.replace(MET, wait=5.0, waited=True, copy_waiting=LIVE), m.REQUEUE, "live"),
    (
        8,
        dataclasses.replace(MET, own_hold=True, own_assessed=True, own_verdict=DEAD),
        m.TAKE_OVER,
        "dead",
    ),  # fmt: skip
    (
        9,
        dataclasses.replace(MET, own_hold=True, own_assessed=True, own_verdict=LATER),
        m.DROP,
        "obsolete",
    ),  # fmt: skip
    (
        10,
        dataclasses.replace(
            MET, own_hold=True, own_assessed=True, own_verdict=DEAD, took_over=True, acquired=True
        ),
        m.RUN,
        "",
    ),  # fmt: skip
    (
        11,
        dataclasses.replace(MET, own_hold=True, own_assessed=True, own_verdict=LIVE),
        m.REQUEUE,
        "live",
    ),  # fmt: skip
    (12, S(attempt=0, requeued=True, finished="SUCCESS"), m.DROP, "original run ended"),
    (13, S(attempt=0, acquired=True, ended=0, outcome_missing=False), m.DROP, "ended already"),
    (14, S(attempt=0, acquired=True, ended=0, outcome_missing=True), m.REQUEUE, "not stored"),
    (
        15,
        S(attempt=0, acquired=True, ended=0, outcome_missing=True, outcome_requeued=True),
        m.RUN,
        "runs again",
    ),  # fmt: skip
    (
        16,
        dataclasses.replace(
            MET, own_hold=True, own_delay_until_ms=1, outcome_requeued=True, outcome_missing=True
        ),
        m.REQUEUE,
        "release delay",
    ),  # fmt: skip
    (
        17,
        S(attempt=0, acquired=False, replaced_at_acquire=True, holds_read=True),
        m.REPLACED,
        "",
    ),  # fmt: skip
    (
        17,
        S(attempt=0, leaves_queue_first=True, left_queue=False, holds_read=True),
        m.REPLACED,
        "",
    ),  # fmt: skip
    (18, S(attempt=0, backend_error="no answer"), m.FAIL, "no answer"),
    (18, S(attempt=0, backend_error="no answer", backend_down="run"), m.RUN_UNLOCKED, ""),
    (
        23,
        S(attempt=0, acquired=False, held_by_call=True, takes_over=False, holds_read=True),
        m.REQUEUE,
        "hold of this task id",
    ),  # fmt: skip
    (24, S(attempt=0, acquired=True, ended=0, new_send=True), m.RUN, ""),
]


@pytest.mark.parametrize(
    "row, snapshot, kind, why",
    [pytest.param(*case, id=f"row{case[0]}-{i}") for i, case in enumerate(ROWS)],
)
def test_each_row_decides_its_action(row: int, snapshot: Snapshot, kind: str, why: str) -> None:
    action = decide(snapshot)
    assert action.kind == kind
    assert why in action.why


def test_the_observations_come_in_the_table_order() -> None:
    """A run asks for what it needs, in order: a re-queued copy reads the result backend
    first, a call that leaves the queue first does so before its acquire, the done mark's
    outcome only when an attempt of the send ended, the holders only when not acquired, its
    own hold's verdict only when a hold of its own call stands on an exclusive lease."""
    assert decide(S(attempt=0, requeued=True)).kind == m.READ_FINISHED
    assert decide(S(attempt=0, requeued=True, finished="")).kind == m.ACQUIRE
    assert decide(S(attempt=0, leaves_queue_first=True)).kind == m.LEAVE_QUEUE
    assert decide(S(attempt=0, leaves_queue_first=True, left_queue=True)).kind == m.ACQUIRE
    assert decide(S(attempt=1, acquired=True, ended=1)).kind == m.READ_OUTCOME
    assert decide(S(attempt=1, acquired=True, ended=0)).kind == m.RUN  # an earlier attempt
    assert decide(S(attempt=0, acquired=False)).kind == m.READ_HOLDS
    assert decide(dataclasses.replace(MET, own_hold=True)).kind == m.READ_OWN_HOLD


def test_a_copy_of_a_shared_hold_is_requeued_or_ignored_never_taken_over() -> None:
    """Reader-writer, range, multi-key and permits cannot take a hold over: a copy meeting its
    own call's hold looks again once a dead holder's lease could have run out; one meeting
    its call's release delay stores nothing."""
    shared = dataclasses.replace(MET, takes_over=False, own_hold=True)
    action = decide(shared)
    assert (action.kind, action.look_again) == (m.REQUEUE, m.AFTER_LEASE)
    delayed = dataclasses.replace(shared, own_delay_until_ms=5)
    assert decide(delayed).kind == m.DROP


def test_a_shared_hold_refused_to_its_own_call_meets_that_hold() -> None:
    """A read hold, range or permit is refused in its acquire's own script call while a hold
    of the same call stands (held_by_call): the copy is re-queued, also when the refusal
    comes at the end of its wait."""
    refused = S(attempt=0, acquired=False, held_by_call=True, takes_over=False, holds_read=True)
    assert decide(refused).kind == m.REQUEUE
    after_wait = dataclasses.replace(MET, takes_over=False, wait=2.0, waited=True,
                                     held_by_call=True)  # fmt: skip
    assert decide(after_wait).kind == m.REQUEUE


def test_a_hold_that_changed_hands_is_looked_at_again_soon() -> None:
    took = dataclasses.replace(MET, own_hold=True, own_assessed=True, own_verdict=DEAD)
    failed = dataclasses.replace(took, took_over=False)
    action = decide(failed)
    assert (action.kind, action.countdown) == (m.REQUEUE, own_holds.MARGIN_S)
    gone = dataclasses.replace(MET, own_hold=True, own_assessed=True, own_verdict=None)
    assert decide(gone).kind == m.REQUEUE
    assert decide(dataclasses.replace(gone, own_delay_until_ms=9)).kind == m.DROP


def test_a_copy_of_a_started_call_that_a_later_call_replaced_in_the_queue_is_not_lost() -> None:
    """``debounce``: the call left the queue and started, a later call queued; a copy of the
    started call (its worker killed, RabbitMQ redelivering at once) meets its own hold: taken
    over when dead, re-queued when alive, dropped only in its call's own release delay."""
    replaced = S(attempt=0, acquired=False, replaced_at_acquire=True, holds_read=True)
    own = dataclasses.replace(replaced, own_hold=True)
    assert decide(own).kind == m.READ_OWN_HOLD
    dead = dataclasses.replace(own, own_assessed=True, own_verdict=DEAD)
    assert decide(dead).kind == m.TAKE_OVER
    assert decide(dataclasses.replace(dead, took_over=True, acquired=True)).kind == m.RUN
    live = dataclasses.replace(own, own_assessed=True, own_verdict=LIVE)
    assert decide(live).kind == m.REQUEUE
    delayed = dataclasses.replace(own, own_assessed=True, own_delay_until_ms=5)
    assert decide(delayed).kind == m.DROP


def test_the_done_mark_wins_over_the_lock_taken() -> None:
    """A copy that took the lock after its send ended gives it back and is dropped: the
    mark is read in the acquire's own round trip, and decided on before the lock is used."""
    action = decide(S(attempt=0, acquired=True, ended=2, outcome_missing=False))
    assert action.kind == m.DROP and "attempt 2" in action.why


def test_every_end_is_reached_and_decide_is_total() -> None:
    """Walk every combination of the observed booleans: decide() always answers a known
    action, and every end of the table is reachable."""
    kinds = set()
    flags = ["acquired", "holds_read", "own_hold", "waited", "replaced_at_acquire"]
    for bits in range(2 ** len(flags)):
        values = {flag: bool(bits >> i & 1) for i, flag in enumerate(flags)}
        for conflict in ("skip", "raise", "retry"):
            for extra in ({}, {"own_assessed": True, "own_verdict": LIVE}, {"ended": 0,
                          "outcome_missing": False}):  # fmt: skip
                action = decide(S(attempt=0, conflict=conflict, wait=1.0, **values, **extra))
                assert action.kind in m.ENDS or action.kind in OBSERVATIONS
                kinds.add(action.kind)
    assert {m.RUN, m.SKIP, m.CONFLICT_RAISE, m.CONFLICT_RETRY, m.REQUEUE, m.DROP} <= kinds


OBSERVATIONS = {
    m.ACQUIRE, m.READ_FINISHED, m.READ_OUTCOME, m.READ_HOLDS, m.READ_OWN_HOLD, m.LEAVE_QUEUE,
    m.TAKE_OVER, m.WAIT,
}  # fmt: skip


def test_every_row_of_the_docs_table_that_decide_holds_has_a_case_here() -> None:
    """Rows 1 and 19-22 are decided before or after the run (a direct call, the send id, the
    retry and the replacement: task.py and sends.py); every other row has a case above."""
    docs = (Path(__file__).resolve().parent.parent.parent / "docs" / "run-semantics.md").read_text()
    table = docs[docs.index("## The outcome table") :]
    numbers = {int(n) for n in re.findall(r"^\| (\d+) \|", table, re.M)}
    covered = {row for row, *_ in ROWS}
    assert numbers - covered == {1, 19, 20, 21, 22}
