"""The chaos history check: real prefork workers killed, paused past their lease, cut off from
a restarted lock Redis and answered late by it, every call tracked from send to its end
(see tests/support/chaos.py and tests/support/history.py; a longer soak:
``.venv/bin/python tests/chaos.py --seconds 300``). The checker's rules are also tested on
small made-up histories, so that each kind of violation is known to be caught."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from support.chaos import Progress, Workers, run_chaos
from support.history import Call, Faults, History, Report, check

from celery_singleton_lock.embedded import RedisServer

#: Seconds of chaos in the test suite.
CI_SECONDS = 55.0
#: Seconds the drain test waits for its calls at most.
DRAIN_TIMEOUT = 60.0


# xdist_group "process-heavy": the chaos run and the benchmark smoke runs each start several
# worker processes and keep the CPU busy for tens of seconds; in one group they run one after
# the other on one xdist worker rather than starving each other's heartbeats side by side.
@pytest.mark.xdist_group("process-heavy")
@pytest.mark.timeout(240)
def test_history_under_kills_pauses_restarts_and_late_replies(tmp_path: Path) -> None:
    seed = random.randrange(1_000_000)
    lines: list[str] = []
    report = run_chaos(CI_SECONDS, seed=seed, log_dir=tmp_path, out=lines.append)
    print(f"seed {seed}:", *lines, sep="\n")
    summary = f"seed {seed}: " + "\n".join(lines)
    assert report.violations == [], summary
    # The chaos did happen, and the calls went through it.
    assert report.child_kills + report.worker_kills >= 1, summary
    assert report.pauses >= 1 and report.restarts >= 1 and report.reply_delays >= 1, summary
    assert report.calls_sent >= 100 and report.lost_calls == 0, summary
    assert report.skipped >= 1, summary
    assert report.accepted_runs >= report.completed * 0.9, summary


@pytest.mark.xdist_group("process-heavy")
@pytest.mark.timeout(180)
def test_drain_waits_for_a_delivery_of_a_call_that_settled_already(tmp_path: Path) -> None:
    with RedisServer() as broker, RedisServer() as lock:
        pool = Workers(lock.url, broker.url, f"csltest:drain:{broker.port}:", tmp_path)
        try:
            pool.wait_ready(pool.start(concurrency=1))
            task = pool.app.tasks["fault.chaos"]
            result = task.apply_async(("k0", 0.3))
            calls = {result.id: Call("k0", task.name)}
            progress = Progress(pool)
            progress.drain(calls, DRAIN_TIMEOUT)
            assert result.id in progress.settled
            # The call's message delivered once more after the call settled, as when a
            # visibility timeout ran out while its first delivery waited for the key: the
            # history is read only once that delivery is done with, its run ended.
            pool.app.send_task(task.name, ("k0", 0.3), task_id=result.id)
            progress.drain(calls, DRAIN_TIMEOUT)
            events = [e for e in pool.events() if e.get("task_id") == result.id]
            outcomes = [e for e in events if e["event"] == "outcome"]
            starts = {e["execution"] for e in events if e["event"] == "start"}
            ends = {e["execution"] for e in events if e["event"] == "end"}
            assert len(outcomes) == 2, events
            assert starts == ends and not progress.open_runs, events
        finally:
            pool.close()


# -- the checker on made-up histories -----------------------------------------------------------


def _run(
    task_id: str, pid: int, token: int, start: float, end: float | None
) -> list[dict[str, Any]]:
    execution = f"{task_id}/0/{pid}/{token}"  # task id, attempt, pid, token
    run = {"task_id": task_id, "key": "k0", "pid": pid, "token": str(token)}
    run |= {"execution": execution, "worker": "w1@localhost", "attempt": 0}
    events = [
        {"event": "received", "time": start - 0.01, "task_id": task_id, "pid": pid},
        {"event": "start", "time": start, **run},
    ]
    if end is not None:
        events.append({"event": "end", "time": end, **run})
        events.append({"event": "outcome", "time": end, "task_id": task_id, "pid": pid})
    return events


def _check(events: list[dict[str, Any]], states: dict[str, str], faults: Faults) -> Report:
    calls = {task_id: Call("k0", "fault.chaos") for task_id in states}
    history = History(calls, events, {}, {}, states, set(), faults)
    report = Report(0.0)
    check(history, report)
    return report


def test_history_check_flags_two_overlapping_runs_of_a_key() -> None:
    events = _run("t-a", 11, 1, 100.0, 102.0) + _run("t-b", 12, 2, 101.0, 103.0)
    report = _check(events, {"t-a": "SUCCESS", "t-b": "SUCCESS"}, Faults())
    [violation] = report.violations
    assert violation.startswith("k0: run t-a/0/11/1 (task t-a, token 1")
    assert "run t-b/0/12/2 (task t-b, token 2" in violation and "beside it" in violation
    # The same overlap after the earlier holder was paused past its lease is excused.
    paused = Faults(pauses=[(11, 100.5, 101.5)])
    assert _check(events, {"t-a": "SUCCESS", "t-b": "SUCCESS"}, paused).violations == []


def test_history_check_excuses_a_run_whose_lock_a_restart_took_before_it_started() -> None:
    """Its acquire ran, the lock Redis restarted empty, another run took the key, and the
    acquire's late reply started the first beside it: the overlap is the restart's (the
    late run's older token is fenced off). Without the restart it is a violation."""
    late = _run("t-b", 12, 1, 101.0, 103.0)
    late[0]["time"] = 99.0  # received (and acquired, token 1) before the restart
    events = _run("t-a", 11, 2, 100.0, 102.0) + late
    states = {"t-a": "SUCCESS", "t-b": "SUCCESS"}
    assert any("beside it" in v for v in _check(events, states, Faults()).violations)
    restarted = Faults(restarts=[(99.5, 99.8)])
    assert _check(events, states, restarted).violations == []


def test_history_check_flags_a_run_overlapping_a_killed_one_before_its_kill() -> None:
    events = _run("t-a", 11, 1, 100.0, None) + _run("t-b", 12, 2, 101.0, 102.0)
    faults = Faults(kills=[(101.5, 101.6, {11})])
    report = _check(events, {"t-a": "SUCCESS", "t-b": "SUCCESS"}, faults)
    assert any("k0: run t-a/0/11/1" in v and "(killed)" in v for v in report.violations)
    # Started after the kill: no overlap.
    events = _run("t-a", 11, 1, 100.0, None) + _run("t-b", 12, 2, 101.7, 102.0)
    assert not any("beside it" in v for v in _check(events, {"t-b": "SUCCESS"}, faults).violations)


def test_history_check_flags_a_call_a_killed_process_received_and_nobody_ran_again() -> None:
    events = _run("t-a", 11, 1, 100.0, None)
    report = _check(events, {"t-a": "PENDING"}, Faults(kills=[(101.0, 101.1, {11})]))
    [violation] = report.violations
    assert violation.startswith("k0: call t-a (fault.chaos) neither completed nor was reported")
    assert "pid 11 killed@101.100" in violation and report.lost_calls == 1


def test_history_check_counts_a_retry_a_killed_worker_popped_as_the_brokers_loss() -> None:
    received = {"event": "received", "time": 100.0, "task_id": "t-a", "pid": 11}
    retried = {"event": "outcome", "time": 100.5, "task_id": "t-a", "pid": 11, "state": "RETRY"}
    events = [received, retried]
    # A whole worker killed after the retry was sent: Kombu's pop may have taken it.
    report = _check(events, {"t-a": "RETRY"}, Faults(worker_kills=[101.0]))
    assert report.violations == [] and report.broker_dropped == 1
    assert report.dropped[0].startswith("k0: call t-a (fault.chaos)")
    # No worker killed since it was received, or the retry ended in Ignore: that call is lost.
    assert _check(events, {"t-a": "RETRY"}, Faults(worker_kills=[99.9])).lost_calls == 1
    ignored = {**retried, "state": "IGNORED", "time": 101.5}
    events += [{**received, "time": 101.4, "pid": 12}, ignored]
    assert _check(events, {"t-a": "RETRY"}, Faults(worker_kills=[101.0, 102.0])).lost_calls == 1


def test_history_check_takes_failed_calls_and_skips_for_another_call_as_reported() -> None:
    skip = {"event": "skipped", "time": 101.0, "task_id": "t-b", "pid": 12, "reason": "taken"}
    events = _run("t-a", 11, 1, 100.0, 102.0) + [{**skip, "holder": "t-a"}]
    report = _check(events, {"t-a": "SUCCESS", "t-b": "SUCCESS", "t-c": "FAILURE"}, Faults())
    assert report.violations == []
    assert (report.completed, report.skipped, report.failed) == (1, 1, 1)
    # Skipped as a duplicate of itself (its own earlier attempt's hold): that call is lost.
    events = _run("t-a", 11, 1, 100.0, 102.0) + [{**skip, "holder": "t-b"}]
    [violation] = _check(events, {"t-a": "SUCCESS", "t-b": "SUCCESS"}, Faults()).violations
    assert violation.startswith("k0: call t-b (fault.chaos) was skipped as a duplicate of itself")


def test_history_check_flags_an_attempt_run_again_after_it_ended() -> None:
    # A redelivered copy of t-a took the key after the original's run ended and ran it again.
    events = _run("t-a", 11, 1, 100.0, 101.0) + _run("t-a", 12, 2, 101.5, 102.0)
    report = _check(events, {"t-a": "SUCCESS"}, Faults())
    [violation] = report.violations
    assert violation.startswith("k0: run t-a/0/11/1 (task t-a, token 1, attempt 0")
    assert "ran the same attempt again from 101.500" in violation
    assert report.repeated_runs == 1
    # Excused: the first process killed after its body ended (the end of the call was not
    # recorded, so its message is due again), or the lock Redis restarted in between.
    killed = Faults(kills=[(101.1, 101.2, {11})])
    assert _check(events, {"t-a": "SUCCESS"}, killed).violations == []
    restarted = Faults(restarts=[(101.2, 101.3)])
    assert _check(events, {"t-a": "SUCCESS"}, restarted).violations == []
