"""The history check of the chaos suite (support/chaos.py gathers the history; this module
only judges it, without I/O).

The history: every call the driver SENT (task id, key, task); every event the workers
recorded on the evidence Redis (``received``, a run's ``start`` and ``end`` with its fencing
token, worker, pid and attempt, ``outcome`` of each delivery, ``skipped`` with the holder and
reason, ``lost``); the fenced store's logs of accepted and rejected writes per key; each
call's state in the result backend; the calls still in the broker; and the faults the driver
injected. The check fails on:

- accepted tokens of a key going down, or equal across two runs;
- two accepted runs of a key (begin and commit both accepted) overlapping in store time;
- two runs of a key overlapping at all (a killed run ends when it was killed), or a write
  rejected by the fence, unless the earlier run was SIGSTOPped or the lock Redis restarted
  while it ran, or the later one was between its delivery and its start (it took its lock
  before a restart emptied the server, and its acquire's reply came after: its older token
  is fenced off): an undisturbed holder is never overlapped nor fenced off;
- a run that started and never ended in a process nobody killed;
- one attempt of a call run to its end twice (a redelivered copy ran it again), unless the
  earlier run's process was killed after its body ended, it was paused, or the lock Redis
  restarted in between;
- a call that neither completed (a run ended and the backend says SUCCESS) nor was reported:
  FAILURE or REVOKED in the backend, or skipped (``lock_skipped``) for another call holding
  its key. A call a killed process had received is no exception: ``acks_late`` and
  ``reject_on_worker_lost`` deliver it again. The one exception is the broker's: a message
  (the call's first, its retry, or one given back by a killed run) that no process
  received, that is neither queued nor unacked, and that was sent before a whole worker was
  SIGKILLed, was taken by that worker between Kombu's pop and its unacked record (counted
  as ``broker_dropped`` and shown, never silently).

Every violation names the key, the task id and what was missing or overlapping.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

#: Backend states that report a call that did not complete.
REPORTED_STATES = ("FAILURE", "REVOKED")


@dataclass
class Faults:
    """What the driver did, in evidence-server time: kills (times read just before and just
    after the signal, pids), pauses (pid, stopped, continued), lock Redis restarts (stopped,
    up), and how many script replies the lock Redis's proxy held back."""

    kills: list[tuple[float, float, set[int]]] = field(default_factory=list)
    pauses: list[tuple[int, float, float]] = field(default_factory=list)
    restarts: list[tuple[float, float]] = field(default_factory=list)
    reply_delays: int = 0
    worker_kills: list[float] = field(default_factory=list)  # just before each


@dataclass
class Call:
    key: str
    task: str


@dataclass
class History:
    calls: dict[str, Call]  # task id -> the call sent
    events: list[dict[str, Any]]
    accepted: dict[str, list[list[str]]]  # key -> [token, execution, op, time] entries
    rejected: dict[str, list[list[str]]]
    states: dict[str, str]  # task id -> result backend state
    in_broker: set[str]  # task ids still queued or unacked
    faults: Faults


@dataclass
class Report:
    seconds: float
    calls_sent: int = 0
    completed: int = 0
    failed: int = 0
    skipped: int = 0
    executions: int = 0
    accepted_runs: int = 0
    accepted_writes: int = 0
    rejected_writes: int = 0
    raw_overlaps: int = 0
    repeated_runs: int = 0  # an attempt's body run again after it ended
    child_kills: int = 0
    worker_kills: int = 0
    killed_mid_run: int = 0
    pauses: int = 0
    restarts: int = 0
    reply_delays: int = 0
    lost_signals: int = 0
    lost_calls: int = 0
    broker_dropped: int = 0
    violations: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # what the broker lost, shown apart

    def summary(self) -> str:
        return (
            f"chaos {self.seconds:.0f} s: calls={self.calls_sent} completed={self.completed}"
            f" failed={self.failed} skipped={self.skipped} executions={self.executions}"
            f" accepted_runs={self.accepted_runs} accepted_writes={self.accepted_writes}"
            f" rejected_writes={self.rejected_writes} raw_overlaps={self.raw_overlaps}"
            f" repeated_runs={self.repeated_runs}"
            f" child_kills={self.child_kills} worker_kills={self.worker_kills}"
            f" killed_mid_run={self.killed_mid_run} pauses={self.pauses}"
            f" restarts={self.restarts} reply_delays={self.reply_delays}"
            f" lock_lost={self.lost_signals} lost_calls={self.lost_calls}"
            f" broker_dropped={self.broker_dropped} violations={len(self.violations)}"
        )


@dataclass
class Run:
    """One delivery's run of a call's body, from its ``start`` record."""

    execution: str
    task_id: str
    key: str
    token: str
    worker: str
    pid: int
    attempt: int
    start: float
    end: float | None  # its ``end`` record, or when its process was killed
    killed: bool

    def describe(self) -> str:
        return (
            f"run {self.execution} (task {self.task_id}, token {self.token}, attempt"
            f" {self.attempt}, {self.worker} pid {self.pid})"
        )


def _overlaps(a0: float, a1: float, b0: float, b1: float) -> bool:
    return a0 < b1 and b0 < a1


def check(history: History, report: Report) -> None:
    """Fill ``report``'s counts and violations from ``history``."""
    events, faults = history.events, history.faults
    # pid -> (just before, just after) its SIGKILL: a run there ended before the latter,
    # and not before the former (so an overlap with it is never made up).
    killed_at: dict[int, tuple[float, float]] = {}
    for before, after, pids in faults.kills:
        for pid in pids:
            killed_at.setdefault(pid, (before, after))
    ends = {e["execution"]: e for e in events if e["event"] == "end"}
    received: dict[tuple[str, int], list[float]] = defaultdict(list)
    for e in events:
        if e["event"] == "received":
            received[(e["task_id"], e["pid"])].append(e["time"])
    runs: dict[str, Run] = {}
    for e in events:
        if e["event"] != "start":
            continue
        end = ends.get(e["execution"])
        kill = killed_at.get(e["pid"])
        killed = end is None and kill is not None and kill[1] >= e["time"]
        if end is not None:
            until: float | None = end["time"]
        else:
            until = max(kill[0], e["time"]) if kill is not None and killed else None
        runs[e["execution"]] = Run(
            e["execution"], e["task_id"], e["key"], str(e["token"]), e.get("worker", "?"),
            e["pid"], e.get("attempt", 0), e["time"], until, killed,
        )  # fmt: skip
    report.executions = len(runs)
    report.lost_signals = sum(1 for e in events if e["event"] == "lost")
    report.pauses, report.restarts = len(faults.pauses), len(faults.restarts)
    report.reply_delays = faults.reply_delays

    def began(run: Run) -> float:
        """When its delivery reached the process (it may have waited for the lock)."""
        times = [t for t in received.get((run.task_id, run.pid), []) if t <= run.start]
        return max(times) if times else run.start

    def excused(run: Run, until: float) -> bool:
        """Paused, or the lock server restarted, while this run ran."""
        since = began(run)
        if any(p == run.pid and _overlaps(since, until, s, c) for p, s, c in faults.pauses):
            return True
        return any(_overlaps(since, until, s, c) for s, c in faults.restarts)

    for run in runs.values():
        if run.killed:
            report.killed_mid_run += 1
        elif run.end is None:
            report.violations.append(
                f"{run.key}: {run.describe()} started and never ended, and no one killed it"
            )
    for key in sorted({call.key for call in history.calls.values()}):
        _check_key(key, history, [r for r in runs.values() if r.key == key], excused, report)
    _check_repeats(runs, killed_at, excused, report)
    _check_calls(history, runs, killed_at, report)


def _check_repeats(
    runs: dict[str, Run],
    killed_at: dict[int, tuple[float, float]],
    excused: Any,
    report: Report,
) -> None:
    """One attempt of a call whose body ran to its end is not run again by a copy of its
    message: unless the earlier run's process was killed after the body ended (before the
    end of the call was recorded, the message is due again), it was paused, or the lock
    Redis restarted (losing what was recorded) before the later run started."""
    by_attempt: dict[tuple[str, int], list[Run]] = defaultdict(list)
    for run in runs.values():
        if run.end is not None and not run.killed:
            by_attempt[(run.task_id, run.attempt)].append(run)
    for attempt_runs in by_attempt.values():
        attempt_runs.sort(key=lambda r: r.start)
        for earlier, later in zip(attempt_runs, attempt_runs[1:], strict=False):
            assert earlier.end is not None
            report.repeated_runs += 1
            kill = killed_at.get(earlier.pid)
            if kill is not None and earlier.end <= kill[1] and kill[0] <= later.start:
                continue
            if excused(earlier, later.start):
                continue
            report.violations.append(
                f"{earlier.key}: {earlier.describe()} ran to its end at {earlier.end:.3f},"
                f" undisturbed, and {later.describe()} ran the same attempt again from"
                f" {later.start:.3f}"
            )


def _check_key(key: str, history: History, runs: list[Run], excused: Any, report: Report) -> None:
    accepted = history.accepted.get(key, [])
    rejected = history.rejected.get(key, [])
    by_execution = {run.execution: run for run in runs}
    report.accepted_writes += len(accepted)
    report.rejected_writes += len(rejected)
    # Tokens of accepted writes never go down; equal only within one run.
    for (token0, exe0, _, _), (token1, exe1, _, _) in zip(accepted, accepted[1:], strict=False):
        if int(token1) < int(token0) or (int(token1) == int(token0) and exe1 != exe0):
            report.violations.append(
                f"{key}: write of run {exe1} accepted with token {token1} after run {exe0}'s"
                f" token {token0}"
            )
    # Accepted runs (begin and commit both accepted) never overlap in store time.
    spans: dict[str, dict[str, float]] = defaultdict(dict)
    for _, execution, op, at in accepted:
        spans[execution][op] = float(at)
    done = sorted(
        (span["begin"], span["commit"], execution)
        for execution, span in spans.items()
        if "begin" in span and "commit" in span
    )
    report.accepted_runs += len(done)
    for (_, end0, exe0), (begin1, _, exe1) in zip(done, done[1:], strict=False):
        if begin1 < end0:
            report.violations.append(
                f"{key}: accepted runs {exe0} (commit {end0:.3f}) and {exe1} (begin"
                f" {begin1:.3f}) overlap"
            )
    # Every rejected write comes from a disturbed run.
    for _, execution, op, at in rejected:
        run = by_execution.get(execution)
        if run is None or not excused(run, float(at)):
            report.violations.append(
                f"{key}: {op} of undisturbed run {execution} was rejected by the fence"
            )

    # Two runs of a key overlap only where the earlier one was disturbed while it ran, or the
    # later one before it started (its lock lost while its acquire's reply was on the way).
    def lost_first(later: Run, earlier: Run) -> bool:
        """The later run took its lock first (an older token) and was disturbed before it
        started: a restart emptied the server while its acquire's reply was on the way."""
        return int(later.token) < int(earlier.token) and excused(later, later.start)

    ordered = sorted((run for run in runs if run.end is not None), key=lambda r: r.start)
    for i, later in enumerate(ordered):
        for earlier in ordered[:i]:
            assert earlier.end is not None
            if earlier.end > later.start:
                report.raw_overlaps += 1
                if not excused(earlier, earlier.end) and not lost_first(later, earlier):
                    how = "killed" if earlier.killed else "ended"
                    report.violations.append(
                        f"{key}: {earlier.describe()} ran {earlier.start:.3f}-{earlier.end:.3f}"
                        f" ({how}), undisturbed, and {later.describe()} started"
                        f" {later.start:.3f} beside it"
                    )


def _check_calls(
    history: History,
    runs: dict[str, Run],
    killed_at: dict[int, tuple[float, float]],
    report: Report,
) -> None:
    by_call: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in history.events:
        if e.get("task_id"):
            by_call[e["task_id"]].append(e)
    ended = {run.task_id for run in runs.values() if run.end is not None and not run.killed}
    report.calls_sent = len(history.calls)
    lost: list[tuple[str, str]] = []  # task id, what is missing
    for task_id, call in history.calls.items():
        state = history.states.get(task_id, "PENDING")
        skips = [e for e in by_call[task_id] if e["event"] == "skipped"]
        if state == "SUCCESS" and task_id in ended:
            report.completed += 1
        elif state == "SUCCESS" and skips:
            report.skipped += 1
            for skip in skips:
                if skip.get("holder") == task_id:
                    report.violations.append(
                        f"{call.key}: call {task_id} ({call.task}) was skipped as a duplicate"
                        f" of itself ({skip.get('reason')}): {_story(by_call[task_id], killed_at)}"
                    )
        elif state in REPORTED_STATES:
            report.failed += 1
        else:
            if _dropped_by_broker(task_id, by_call[task_id], history):
                report.broker_dropped += 1
                report.dropped.append(
                    f"{call.key}: call {task_id} ({call.task}), a message of which no process"
                    f" received: {_story(by_call[task_id], killed_at)}"
                )
                continue
            where = "still in the broker" if task_id in history.in_broker else "not queued"
            lost.append((task_id, f"backend state {state}, {where}"))
    report.lost_calls = len(lost)
    for task_id, missing in lost[:20]:
        call = history.calls[task_id]
        report.violations.append(
            f"{call.key}: call {task_id} ({call.task}) neither completed nor was reported"
            f" ({missing}): {_story(by_call[task_id], killed_at)}"
        )


def _dropped_by_broker(task_id: str, events: list[dict[str, Any]], history: History) -> bool:
    """Whether the call's last message (its first, the retry its last delivery sent, or
    its last delivery's message given back when that process was killed) reached no
    process, is not in the broker, and a whole worker was killed after it was sent (that
    worker's pop took it)."""
    if task_id in history.in_broker:
        return False
    received = [e for e in events if e["event"] == "received"]
    since = float("-inf")
    if received:
        last = max(received, key=lambda e: e["time"])
        since = last["time"]
        outcomes = [
            e.get("state")
            for e in events
            if e["event"] == "outcome" and e["pid"] == last["pid"] and e["time"] >= since
        ]
        killed = not outcomes and any(
            last["pid"] in pids and after_kill >= since
            for _, after_kill, pids in history.faults.kills
        )
        if "RETRY" not in outcomes and not killed:
            return False  # its last message was received: what followed is not the broker's
    return any(at > since for at in history.faults.worker_kills)


def _story(events: list[dict[str, Any]], killed_at: dict[int, tuple[float, float]]) -> str:
    """What happened to one call, in order, for a violation message."""
    parts = []
    for e in sorted(events, key=lambda e: e["time"]):
        detail = {
            "received": f" {e.get('worker')}",
            "start": f" token={e.get('token')} attempt={e.get('attempt')}",
            "end": f" committed={e.get('committed')} lost={e.get('lost')}",
            "outcome": f" {e.get('state')}",
            "skipped": f" holder={e.get('holder')} ({e.get('reason')})",
            "lost": f" {e.get('reason')}",
        }.get(e["event"], "")
        parts.append(f"{e['event']}@{e['time']:.3f} pid={e['pid']}{detail}")
    for pid in sorted({e["pid"] for e in events} & killed_at.keys()):
        parts.append(f"pid {pid} killed@{killed_at[pid][1]:.3f}")
    return ", ".join(parts) or "no record at all"
