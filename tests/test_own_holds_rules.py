"""The rules of celery/own_holds.py, without I/O: what a run does about a hold of its own task
id, by the holder's attempt, heartbeat and process."""

from __future__ import annotations

import dataclasses

import pytest

from celery_singleton_lock.celery.own_holds import (
    IGNORE,
    REQUEUE,
    TAKE_OVER,
    OwnHold,
    Verdict,
    decide,
)
from celery_singleton_lock.core.holder import HOSTNAME
from celery_singleton_lock.core.pid_evidence import ALIVE, GONE, UNKNOWN

NODE = "celery@here"
LIVE = OwnHold(
    owner="a-run", attempt=0, claimed=False, stale=False, overdue_in=5.0, lease=30.0,
    host=HOSTNAME, pid=4242, proc="b00:1:2:3", worker="celery@elsewhere",
)  # fmt: skip


def verdict(
    hold: OwnHold,
    attempt: int = 0,
    process: str = ALIVE,
    requeues: int = 0,
    max_countdown: float | None = None,
) -> Verdict:
    return decide(
        hold,
        attempt=attempt,
        node=NODE,
        process=lambda _pid, _proc: process,
        requeues=requeues,
        max_countdown=max_countdown,
    )


def test_an_earlier_attempts_run_or_claim_is_taken_over() -> None:
    assert verdict(LIVE, attempt=1).action == TAKE_OVER
    claim = dataclasses.replace(LIVE, owner="claim:t:0", claimed=True)
    assert verdict(claim, attempt=1).action == TAKE_OVER


def test_a_later_attempts_hold_makes_this_message_obsolete() -> None:
    later = dataclasses.replace(LIVE, attempt=2)
    assert verdict(later, attempt=1).action == IGNORE


def test_same_attempt_dead_by_heartbeat_or_by_its_process_on_this_node() -> None:
    assert verdict(dataclasses.replace(LIVE, stale=True)).action == TAKE_OVER
    mine = dataclasses.replace(LIVE, worker=NODE)
    assert verdict(mine, process=GONE).action == TAKE_OVER
    # A process of another node, or of another host, is no evidence.
    assert verdict(LIVE, process=GONE).action == REQUEUE
    assert verdict(dataclasses.replace(mine, host="other-host"), process=GONE).action == REQUEUE
    # Nor is a pid this process cannot judge (another pid namespace or boot, no mark), nor
    # one that still names a running process (this very one, for a threads pool's copy).
    assert verdict(mine, process=UNKNOWN).action == REQUEUE
    assert verdict(mine, process=ALIVE).action == REQUEUE


@pytest.mark.parametrize(
    ("requeues", "cap", "expected"),
    [(0, None, 6.0), (1, None, 12.0), (9, None, 30.0), (3, 4.0, 4.0)],
)
def test_a_live_original_requeues_the_copy_until_its_heartbeat_could_be_overdue(
    requeues: int, cap: float | None, expected: float
) -> None:
    found = verdict(LIVE, requeues=requeues, max_countdown=cap)
    assert found.action == REQUEUE and found.countdown == expected
    assert "celery@elsewhere" in found.why
