"""The rules of celery/own_holds.py, without I/O: what a run does about a hold of its own task
id, by the holder's attempt, heartbeat and process; and the judgement of the holder's process
it is given in a worker, on real processes."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from celery_singleton_lock.celery.own_holds import (
    IGNORE,
    REQUEUE,
    TAKE_OVER,
    OwnHold,
    Verdict,
    decide,
    process_state,
)
from celery_singleton_lock.core.holder import HOSTNAME
from celery_singleton_lock.core.pid_evidence import (
    ALIVE,
    GONE,
    UNKNOWN,
    ProcessMark,
    this_process_text,
)

NODE = "celery@here"
#: A process that prints its pid and its process mark, and exits.
MARK_OF_CHILD = (
    "from celery_singleton_lock.core.pid_evidence import this_process_text\n"
    "import os; print(os.getpid(), this_process_text())"
)
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process marks need /proc")
def test_this_machines_judgement_of_a_holders_process() -> None:
    # The rule decide() is given in a worker: a real process of this namespace that exited
    # is gone; the same pid recorded in another pid namespace, or without a mark, is not.
    done = subprocess.run([sys.executable, "-c", MARK_OF_CHILD], check=True, capture_output=True)
    pid, proc = done.stdout.decode().split()
    recorded = ProcessMark.parse(proc)
    assert recorded is not None
    elsewhere = dataclasses.replace(recorded, pid_ns=recorded.pid_ns + 1).text()
    assert process_state(int(pid), proc) == GONE
    assert process_state(int(pid), elsewhere) == UNKNOWN
    assert process_state(int(pid), None) == UNKNOWN
    # This process, as a threads pool's copy meets the hold of a run beside it.
    assert process_state(os.getpid(), this_process_text()) == ALIVE
    mine = dataclasses.replace(LIVE, worker=NODE, pid=int(pid), proc=proc)
    taken = decide(mine, attempt=0, node=NODE, process=process_state)
    assert taken.action == TAKE_OVER
    unproven = dataclasses.replace(mine, proc=elsewhere)
    assert decide(unproven, attempt=0, node=NODE, process=process_state).action == REQUEUE


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
