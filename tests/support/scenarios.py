"""Generative history check across the feature matrix (the CLI is tests/scenarios.py, the
suite's short run tests/tasks/test_scenarios.py).

A **scenario** combines one value of each dimension (:data:`DIMENSIONS`):

- ``kind``: how the task locks (tests/apps/scenario_app.py has one task per kind);
- ``feature``: the Celery feature that re-sends or reuses a task id (retries, replace,
  canvases, revoke, countdown/ETA, visibility-timeout redelivery, a re-send of a task id),
  or task ids of an odd spelling (ending in ``}:lock``, as a lock key does);
- ``fault``: what the driver does to the worker or the lock Redis while the calls run;
- ``transport``: the broker, Redis or RabbitMQ.

:func:`pairwise` draws, from a seed, a list of scenarios in which every pair of values of two
dimensions appears (a greedy covering: each scenario covers as many pairs not covered yet as
the candidates drawn allow, so a prefix of the list covers the most pairs it can).

:class:`Runner` runs scenarios one after the other on real ``celery worker`` programs
(prefork, two processes) of ``scenario_app``: per scenario it sends a few calls of one key,
injects the fault, waits (bounded) until every send has an outcome and nothing is left
running or queued, then :func:`check` judges the scenario's history.

**What the check fails** (docs/run-semantics.md, *Redelivered messages*):

1. *Two runs of one key beyond the kind's limit at once*: an exclusive (or write) hold beside
   any other run of its key, a read beside a write, ranges that overlap (unless both
   read), more than ``lock_limit`` runs of a limited key, a multi-key run beside a run on
   any of its keys; and any two runs of one send's same attempt at once (a redelivered
   copy beside its live original, whatever the kind). A run ends at its ``end`` record, or
   when its process was SIGKILLed. Excused: the earlier run was SIGSTOPped past its lease,
   or the lock Redis restarted (empty) while the runs overlapped.
2. *A send with no outcome*. Every send ends in one of:
   - **ran**: a delivery's outcome is SUCCESS and a run of that send ended (its last
     part: the replacement of a replaced call);
   - **skipped**: SUCCESS with a ``lock_skipped`` for that send, naming a holder other than
     its own task id (a skip as a duplicate of itself loses the call);
   - **reported failure**: FAILURE with an exception the docs promise for it: ``LockTimeout``
     (``lock_conflict="raise"``) or the body's planned failure;
   - **revoked**: REVOKED for a send the driver revoked;
   - **deduplicated at enqueue** (``lock_on_enqueue``): ``apply_async`` returned the queued
     or running call's result (that call's own outcome is checked), or raised
     ``DuplicateTask``;
   - **a re-send of a task id** is a new send (docs/run-semantics.md, *A call is a send*): it runs
     as any call. After a SUCCESS of that task id, Celery's result backend keeps the first
     SUCCESS and ignores later results (its own rule against duplicates), so the backend may
     hold the earlier send's result; a re-send dropped as a copy (IGNORED) is a violation;
   - **never sent**: a chain member after a member that failed; a chord's callback fails
     when a member failed.
   Also, where a send ran, the result backend must hold a final state for its task id.
3. *A body run twice for one send*: one attempt (and part) of a send run to its end twice,
   unless the earlier run's process was killed after its body ended, it was paused, or the
   lock Redis restarted in between (the same excuses as the chaos check). A retry is a new
   attempt; a re-send of a task id is a new send.
4. A run that started and never ended in a process nobody killed; a body of the task
   converted by ``singleton_lock_tasks`` that did not run through its class's ``__call__``.

Every violation message starts with the seed and the scenario, and says how to replay it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import redis
from apps.scenario_app import (
    KIND_OPTIONS,
    LEASE,
    NAMED_TASK,
    VISIBILITY_TIMEOUT,
    events_key,
    make_app,
    server_time,
)
from celery import chain, chord, group

from celery_singleton_lock import DuplicateTask
from celery_singleton_lock.celery.app_client import close_lock_client
from celery_singleton_lock.embedded import RedisServer
from support.chaos import Worker
from support.history import Faults
from support.proxies import DelayingProxy
from support.waiting import start_celery_worker

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"

DIMENSIONS: dict[str, tuple[str, ...]] = {
    "kind": (*KIND_OPTIONS, "named"),
    "feature": (
        "none", "retry", "autoretry", "retry_nothrow", "replace", "chain", "group", "chord",
        "revoke", "countdown", "redelivery", "resend_ok", "resend_failed", "odd_task_id",
    ),
    "fault": (
        "none", "kill_child", "kill_worker", "restart_same_name", "pause", "late_reply",
        "redis_restart",
    ),
    "transport": ("redis", "amqp"),
}  # fmt: skip

#: The workers' socket timeout on the lock Redis, and how long a late reply is held back.
SOCKET_TIMEOUT = 1.0
REPLY_DELAY = 1.5
START_TIMEOUT = 90.0
#: Seconds a scenario waits for its sends' outcomes, then for nothing left to run: a
#: scenario ends within about 10 s when nothing is lost (a whole worker killed: its
#: messages come back after the 4 s visibility timeout).
OUTCOME_TIMEOUT = 30.0
#: Seconds the first call of a scenario runs (a fault that needs a run in progress hits it);
#: the others run SHORT.
FIRST = 1.5
SHORT = 0.5
#: How long a fault waits for a run of the scenario to start.
RUN_START_TIMEOUT = 20.0
FINAL_STATES = ("SUCCESS", "FAILURE", "REVOKED")
EXCLUSIVE_KINDS = {
    "exclusive", "conflict_retry", "conflict_raise", "release_delay", "enqueue",
    "until_start", "debounce", "named",
}  # fmt: skip


@dataclass(frozen=True)
class Scenario:
    kind: str
    feature: str
    fault: str
    transport: str

    def label(self) -> str:
        return f"{self.kind}/{self.feature}/{self.fault}/{self.transport}"

    @classmethod
    def parse(cls, label: str) -> Scenario:
        kind, feature, fault, transport = label.split("/")
        scenario = cls(kind, feature, fault, transport)
        for dimension, values in DIMENSIONS.items():
            if getattr(scenario, dimension) not in values:
                raise ValueError(f"{dimension} {getattr(scenario, dimension)!r} not in {values}")
        return scenario


def _pairs(values: dict[str, str]) -> set[tuple[tuple[str, str], tuple[str, str]]]:
    items = sorted(values.items())
    return set(itertools.combinations(items, 2))


def pairwise(
    seed: int, dimensions: dict[str, tuple[str, ...]] = DIMENSIONS, candidates: int = 30
) -> list[Scenario]:
    """Scenarios covering every pair of values of two dimensions, drawn from ``seed``
    (greedy: each next scenario is the best of ``candidates`` random completions of a pair
    not covered yet)."""
    rng = random.Random(seed)
    names = sorted(dimensions)
    uncovered = set()
    for a, b in itertools.combinations(names, 2):
        for va in dimensions[a]:
            for vb in dimensions[b]:
                uncovered.add(((a, va), (b, vb)))
    out: list[Scenario] = []
    while uncovered:
        best: dict[str, str] = {}
        best_gain = -1
        ordered = sorted(uncovered)
        for _ in range(candidates):
            (a, va), (b, vb) = rng.choice(ordered)
            values = {a: va, b: vb}
            rest = [n for n in names if n not in values]
            rng.shuffle(rest)
            for name in rest:
                options = list(dimensions[name])
                rng.shuffle(options)
                values[name] = max(
                    options,
                    key=lambda v, name=name: len(_pairs({**values, name: v}) & uncovered),
                )
            gain = len(_pairs(values) & uncovered)
            if gain > best_gain:
                best, best_gain = values, gain
        uncovered -= _pairs(best)
        out.append(Scenario(**best))
    return out


def uncovered_pairs(scenarios: Sequence[Scenario]) -> set[tuple[tuple[str, str], ...]]:
    """The pairs of values of two dimensions that no scenario of ``scenarios`` has."""
    names = sorted(DIMENSIONS)
    wanted = set()
    for a, b in itertools.combinations(names, 2):
        for va in DIMENSIONS[a]:
            for vb in DIMENSIONS[b]:
                wanted.add(((a, va), (b, vb)))
    for scenario in scenarios:
        wanted -= _pairs({n: getattr(scenario, n) for n in names})
    return wanted


def spread(scenarios: Sequence[Scenario], count: int) -> list[tuple[int, Scenario]]:
    """``count`` of ``scenarios`` (with their indices), chosen so that every value of every
    dimension appears as early as it can: each next one has the most values not chosen yet
    (the earliest of equals), so a short run still meets every kind, feature and fault."""
    pool = list(enumerate(scenarios))
    chosen: list[tuple[int, Scenario]] = []
    seen: set[tuple[str, str]] = set()
    while pool and len(chosen) < count:
        best = max(pool, key=lambda item: len(_values(item[1]) - seen))
        pool.remove(best)
        chosen.append(best)
        seen |= _values(best[1])
    return sorted(chosen)


def _values(scenario: Scenario) -> set[tuple[str, str]]:
    return {(name, getattr(scenario, name)) for name in DIMENSIONS}


def replay_hint(seed: int, index: int, scenario: Scenario) -> str:
    """``index`` -1: a scenario named on its own, not one of the seed's set."""
    how = f"--seed {seed} --only {index}" if index >= 0 else f"--scenario {scenario.label()}"
    return (
        f"seed {seed} scenario #{index} {scenario.label()} (replay: .venv/bin/python"
        f" tests/scenarios.py {how})"
    )


# -- the history of one scenario and its check ---------------------------------------------------


@dataclass
class Send:
    """One send of the driver: a call, a canvas member, a chord callback or a re-send."""

    send: str
    task_id: str
    task: str
    plan: dict[str, Any] = field(default_factory=dict)
    revoked: bool = False
    dedup_of: str | None = None  # the task id apply_async returned instead (lock_on_enqueue)
    refused: str | None = None  # apply_async raised this (DuplicateTask)
    resend_of: str | None = None  # the earlier send of the same task id
    after: str | None = None  # the chain member before it (its send id)
    members: list[str] = field(default_factory=list)  # a chord callback's members (sends)


@dataclass
class ScenarioHistory:
    scenario: Scenario
    sends: list[Send]
    events: list[dict[str, Any]]
    states: dict[str, tuple[str, Any]]  # task id -> (backend state, result)
    faults: Faults


@dataclass
class Run:
    execution: str
    send: str
    task_id: str
    task: str
    kind: str
    attempt: int
    part: str
    pid: int
    start: float
    end: float | None
    killed: bool
    holds: list[tuple[str, str, tuple[int, int] | None]]  # resource, "R"/"W", range
    through_call: bool

    def describe(self) -> str:
        return (
            f"run of send {self.send} (task {self.task_id}, {self.task}, attempt"
            f" {self.attempt}, {self.part}, pid {self.pid}, {self.start:.3f}-"
            f"{'?' if self.end is None else f'{self.end:.3f}'}{' killed' if self.killed else ''})"
        )


def _holds(e: dict[str, Any]) -> list[tuple[str, str, tuple[int, int] | None]]:
    kind, key = e["kind"], e["key"]
    if kind in ("read", "write"):
        return [(key, "R" if e["task"] == "sc.read" else "W", None)]
    if kind == "range":
        mode = "R" if e["task"] == "sc.range_read" else "W"
        return [(key, mode, (int(e["lo"]), int(e["hi"])))]
    if kind == "keys":
        return [(key, "W", None), (e["other"], "W", None)]
    if kind == "limit2":
        return [(key, "N", None)]
    return [(key, "W", None)]


def _conflict(a: Run, b: Run) -> str | None:
    """What two runs at once hold in conflict, or None."""
    for res_a, mode_a, range_a in a.holds:
        for res_b, mode_b, range_b in b.holds:
            if res_a != res_b or mode_a == "N" or mode_b == "N":
                continue
            if mode_a == "R" and mode_b == "R":
                continue
            if range_a and range_b and not (range_a[0] <= range_b[1] and range_b[0] <= range_a[1]):
                continue
            return f"{res_a} ({mode_a}{range_a or ''} beside {mode_b}{range_b or ''})"
    return None


def _runs(events: list[dict[str, Any]], faults: Faults) -> tuple[list[Run], dict[int, Any]]:
    killed_at: dict[int, tuple[float, float]] = {}
    for before, after, pids in faults.kills:
        for pid in pids:
            killed_at.setdefault(pid, (before, after))
    ends: dict[tuple[int, float], dict[str, Any]] = {}
    starts = [e for e in events if e["event"] == "start"]
    by_pid: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["event"] in ("start", "end"):
            by_pid[e["pid"]].append(e)
    # A process runs one body at a time: a start's end is the next record of its pid.
    for records in by_pid.values():
        records.sort(key=lambda e: e["time"])
        for first, second in zip(records, records[1:], strict=False):
            if first["event"] == "start" and second["event"] == "end" and _same(first, second):
                ends[(first["pid"], first["time"])] = second
    runs = []
    for e in starts:
        end = ends.get((e["pid"], e["time"]))
        kill = killed_at.get(e["pid"])
        killed = end is None and kill is not None and kill[1] >= e["time"]
        until = end["time"] if end else (max(kill[0], e["time"]) if killed and kill else None)
        runs.append(
            Run(
                f"{e['send']}/{e['attempt']}/{e['part']}/{e['pid']}@{e['time']:.3f}",
                e["send"],
                e["task_id"],
                e["task"],
                e["kind"],
                int(e["attempt"]),
                e["part"],
                e["pid"],
                e["time"],
                until,
                killed,
                _holds(e),
                bool(e.get("through_call")),
            )  # fmt: skip
        )
    return runs, killed_at


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a[f] == b[f] for f in ("send", "attempt", "part", "task_id"))


def check(history: ScenarioHistory) -> list[str]:
    """The violations of one scenario's history (see the module's docstring)."""
    faults, events = history.faults, history.events
    runs, killed_at = _runs(events, faults)
    out: list[str] = []

    def excused(run: Run, since: float, until: float) -> bool:
        if any(p == run.pid and s < until and since < c for p, s, c in faults.pauses):
            return True
        return any(s < until and since < c for s, c in faults.restarts)

    # 4. runs that never ended; the converted task's __call__.
    for run in runs:
        if run.end is None:
            out.append(f"{run.describe()} started and never ended, and no one killed it")
        if run.kind == "named" and not run.through_call:
            out.append(f"{run.describe()} ran without its task class's __call__")
    # 1. overlaps.
    ended = sorted((r for r in runs if r.end is not None), key=lambda r: r.start)
    for i, later in enumerate(ended):
        for earlier in ended[:i]:
            assert earlier.end is not None and later.end is not None
            if earlier.end <= later.start:
                continue
            what = _conflict(earlier, later)
            same = (earlier.send, earlier.attempt, earlier.part) == (
                later.send,
                later.attempt,
                later.part,
            )
            if what is None and not same:
                continue
            if excused(earlier, earlier.start, min(earlier.end, later.end)):
                continue
            what = what or "the same send's attempt (a copy beside its original)"
            out.append(f"two runs at once on {what}: {earlier.describe()} and {later.describe()}")
    limited = [r for r in ended if any(mode == "N" for _, mode, _ in r.holds)]
    for run in limited:
        beside = [
            r for r in limited if r.start <= run.start < (r.end or 0) and r.holds == run.holds
        ]
        if len(beside) > 2 and not any(excused(r, r.start, run.start) for r in beside):
            out.append(
                f"{len(beside)} runs at once on a lock_limit=2 key: "
                + "; ".join(r.describe() for r in beside)
            )
    # 3. a body run twice.
    by_attempt: dict[tuple[str, int, str], list[Run]] = defaultdict(list)
    for run in ended:
        if not run.killed:
            by_attempt[(run.send, run.attempt, run.part)].append(run)
    for twice in by_attempt.values():
        for earlier, later in zip(twice, twice[1:], strict=False):
            assert earlier.end is not None
            kill = killed_at.get(earlier.pid)
            if kill is not None and earlier.end <= kill[1] and kill[0] <= later.start:
                continue
            if excused(earlier, earlier.start, later.start):
                continue
            out.append(
                f"the body of one send ran twice: {earlier.describe()}, then {later.describe()}"
            )
    # 2. outcomes.
    out += [problem for _, problem in _check_outcomes(history, runs, killed_at)]
    return out


def _check_outcomes(
    history: ScenarioHistory, runs: list[Run], killed_at: dict[int, Any]
) -> list[tuple[str, str]]:
    """(send, what is wrong) for each send whose outcome the docs do not allow; a send
    with no outcome at all says "has no outcome"."""
    out: list[tuple[str, str]] = []
    by_send: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in history.events:
        if e.get("send"):
            by_send[e["send"]].append(e)
    verdicts: dict[str, str] = {}  # send -> ran, skipped, failed, revoked, dedup, dropped, ...
    last_send_of: dict[str, str] = {}
    for s in history.sends:
        if s.dedup_of is None and s.refused is None:
            last_send_of[s.task_id] = s.send
    for s in history.sends:  # in the order sent: a chain member after its predecessor
        evs = by_send[s.send]
        outcomes = [e["state"] for e in evs if e["event"] == "outcome"]
        failures = [e for e in evs if e["event"] == "failure"]
        skips = [e for e in evs if e["event"] == "skipped"]
        done = [r for r in runs if r.send == s.send and r.end is not None and not r.killed]
        part = "replacement" if s.plan.get("replace") else "main"
        state, result = history.states.get(s.task_id, ("PENDING", None))
        verdict = None
        problem = None
        if s.refused is not None:
            verdict = "refused"
        elif s.dedup_of is not None:
            # The queued or running call's result (docs/run-semantics.md, Enqueue-time locks):
            # a call of this scenario, sent before it, whose own outcome is checked.
            if s.dedup_of in {o.task_id for o in history.sends[: history.sends.index(s)]}:
                verdict = "dedup"
            else:
                problem = f"was deduplicated at enqueue onto {s.dedup_of}, no call sent before it"
        elif s.members:
            if any(e["event"] == "collected" for e in evs):
                verdict = "ran"
            elif state == "FAILURE" and any(
                verdicts.get(m) in ("failed", "revoked") for m in s.members
            ):
                verdict = "failed"
        elif (
            s.after is not None
            and not outcomes
            and verdicts.get(s.after) in ("failed", "revoked", "never sent")
        ):
            # Never run: the chain stopped at a member before it (Celery stores that
            # member's FAILURE for the rest of the chain too).
            verdict = "never sent"
        elif "SUCCESS" in outcomes or (
            # Its result stored, its process killed before the outcome record (a copy of its
            # message then dropped).
            state == "SUCCESS"
            and last_send_of[s.task_id] == s.send
            and isinstance(result, dict)
            and (
                result.get("send") == s.send
                or (result.get("__singleton_lock__") == "skipped" and s.resend_of is None)
            )
        ):
            if skips:
                verdict = "skipped"
                own = [k for k in skips if k.get("holder") == s.task_id]
                if own:
                    problem = f"was skipped as a duplicate of itself (holder {s.task_id})"
            elif any(r.part == part for r in done):
                verdict = "ran"
            else:
                problem = f"SUCCESS with no {part} run of its body ended"
        elif "FAILURE" in outcomes or (
            # Stored by the main process for a delivery whose child left no outcome record.
            state == "FAILURE" and last_send_of[s.task_id] == s.send and s.resend_of is None
        ):
            names = {f["exception"] for f in failures}
            allowed = {"LockTimeout"} | ({"PlannedFailure"} if s.plan.get("fail") else set())
            if names and names <= allowed:
                verdict = "failed"
            else:
                why = "; ".join(f"{f['exception']}: {f['message']}" for f in failures)
                problem = f"FAILED with an error the docs do not promise ({why or state})"
        elif s.revoked and (state == "REVOKED" or any(e["event"] == "revoked" for e in evs)):
            verdict = "revoked"
        elif s.resend_of is not None and "IGNORED" in outcomes:
            earlier = verdicts.get(s.resend_of)
            problem = (
                f"a re-send of task id {s.task_id} after its earlier send"
                f" {s.resend_of} ended {earlier}: dropped (IGNORED) as a copy, the backend"
                f" keeps {state}"
            )
        if verdict is None and problem is None:
            problem = "has no outcome"
        if verdict in ("ran", "skipped") and last_send_of.get(s.task_id) == s.send:
            if state not in FINAL_STATES:
                problem = f"ended {verdict} but the backend holds {state} for it"
            elif (
                state == "SUCCESS"
                and isinstance(result, dict)
                and result.get("send") not in (None, s.send)
                # Celery keeps a task id's first SUCCESS: a re-send after it stores nothing.
                and verdicts.get(s.resend_of or "") not in ("ran", "skipped")
            ):
                problem = f"ended {verdict} but the backend holds send {result['send']}'s result"
        verdicts[s.send] = verdict or "lost"
        if problem:
            out.append(
                (
                    s.send,
                    f"send {s.send} (task {s.task_id}, {s.task}, backend {state}) {problem}:"
                    f" {_story(evs, killed_at)}",
                )
            )
    return out


def _story(events: list[dict[str, Any]], killed_at: dict[int, Any]) -> str:
    parts = []
    for e in sorted(events, key=lambda e: e["time"]):
        detail = {
            "received": "",
            "start": f" attempt={e.get('attempt')} {e.get('part')} token={e.get('token')}",
            "end": f" attempt={e.get('attempt')} {e.get('part')}",
            "outcome": f" {e.get('state')}",
            "failure": f" {e.get('exception')}: {e.get('message')}",
            "skipped": f" holder={e.get('holder')} attempt={e.get('attempt')}",
        }.get(e["event"], "")
        parts.append(f"{e['event']}@{e['time']:.3f} pid={e['pid']}{detail}")
    for pid in sorted({e["pid"] for e in events} & killed_at.keys()):
        parts.append(f"pid {pid} killed@{killed_at[pid][1]:.3f}")
    return ", ".join(parts) or "no record at all"


# -- workers and the driver ----------------------------------------------------------------------


def amqp_answers(url: str = AMQP_URL) -> str | None:
    """None when a RabbitMQ answers at ``url``, else why not."""
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, timeout=3)
    except Exception as exc:
        return f"no RabbitMQ answers at {url}: {type(exc).__name__}: {exc}"
    return None


class Transport:
    """One broker's worker (restarted as the faults need) and the twin app that sends."""

    def __init__(self, name: str, runner: Runner) -> None:
        self.name, self.runner = name, runner
        self.broker_url = runner.evidence.url if name == "redis" else AMQP_URL
        self.queue = f"csltest-sc-{runner.tag}-{name}"
        self.app = make_app(
            self.broker_url, runner.evidence.url, runner.lock.url, runner.prefix, self.queue
        )
        self.worker: Worker | None = None
        self._count = 0

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "CSL_SC_BROKER_URL": self.broker_url,
            "CSL_SC_EVIDENCE_URL": self.runner.evidence.url,
            "CSL_SC_LOCK_URL": f"{self.runner.proxy.url}?socket_timeout={SOCKET_TIMEOUT}",
            "CSL_SC_PREFIX": self.runner.prefix,
            "CSL_SC_QUEUE": self.queue,
        }

    def start(self, name: str | None = None) -> Worker:
        self._count += 1
        name = name or f"sc{self._count}-{self.name}-{self.runner.tag}@localhost"
        log = self.runner.log_dir / f"{self.name}-{self._count}.log"
        process = start_celery_worker(
            "apps.scenario_app", queues=[self.queue], name=name, env=self.env(), log=log,
            concurrency=2,
        )  # fmt: skip
        self.worker = Worker(name, process, log)
        self.wait_ready(self.worker)
        return self.worker

    def ensure(self) -> Worker:
        if self.worker is None or not self.worker.alive():
            return self.start()
        return self.worker

    def wait_ready(self, worker: Worker) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if not worker.alive():
                raise RuntimeError(f"worker {worker.name} exited:\n{worker.log_tail(40)}")
            if self.app.control.ping(destination=[worker.name], timeout=0.5):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {worker.name} did not answer in {START_TIMEOUT} s")

    def queued(self) -> int:
        """Messages queued or unacked (Redis transport), or ready (RabbitMQ)."""
        if self.name == "redis":
            broker = self.runner.records
            return int(broker.llen(self.queue)) + int(broker.hlen("unacked"))
        with self.app.connection_for_write() as conn:
            try:
                return int(conn.default_channel.queue_declare(self.queue, passive=True)[1])
            except Exception:
                return 0

    def close(self) -> None:
        if self.worker is not None and self.worker.alive():
            self.worker.kill()
        if self.name == "amqp":
            with contextlib.suppress(Exception), self.app.connection_for_write() as conn:
                conn.default_channel.queue_delete(self.queue)
        close_lock_client(self.app)


@dataclass
class Outcome:
    index: int
    scenario: Scenario
    violations: list[str]
    notes: list[str]
    seconds: float
    sends: int


class Runner:
    """Servers (evidence Redis, lock Redis behind a delaying proxy) and a worker per
    transport, shared by the scenarios run one after the other."""

    def __init__(self, seed: int, log_dir: Path | None = None, out: Callable[[str], Any] = print):
        self.seed, self.out = seed, out
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="csl-scenarios-"))
        self.tag = uuid.uuid4().hex[:8]
        self.prefix = f"csltest:sc:{self.tag}:"
        self.evidence = RedisServer()
        self.evidence.start()
        self.lock = RedisServer()
        self.lock.start()
        self.proxy = DelayingProxy(self.lock.port)
        self.records = redis.Redis.from_url(self.evidence.url)
        self.transports: dict[str, Transport] = {}
        self.amqp_missing = amqp_answers()

    def close(self) -> None:
        for transport in self.transports.values():
            transport.close()
        self.proxy.close()
        self.records.close()
        self.lock.close()
        self.evidence.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def transport(self, name: str) -> Transport:
        if name not in self.transports:
            self.transports[name] = Transport(name, self)
        return self.transports[name]

    def events(self) -> list[dict[str, Any]]:
        raw = self.records.lrange(events_key(self.prefix), 0, -1)
        return [json.loads(item) for item in raw]

    def now(self) -> float:
        return server_time(self.records)

    def run(self, index: int, scenario: Scenario) -> Outcome:
        began = time.monotonic()
        hint = replay_hint(self.seed, index, scenario)
        if scenario.transport == "amqp" and self.amqp_missing:
            self.out(f"SKIPPED {hint}: {self.amqp_missing}")
            return Outcome(index, scenario, [], [f"skipped: {self.amqp_missing}"], 0.0, 0)
        drive = _Drive(self, index, scenario)
        try:
            drive.go()
        except Exception as exc:  # the driver failed: still a finding, with the scenario
            drive.notes.append(f"driver error: {type(exc).__name__}: {exc}")
            drive.violations.append(f"the driver failed: {type(exc).__name__}: {exc}")
        violations = [f"{hint}: {v}" for v in drive.violations]
        outcome = Outcome(
            index, scenario, violations, drive.notes, time.monotonic() - began, len(drive.sends)
        )
        status = "FAIL" if violations else "ok"
        self.out(
            f"{status} #{index} {scenario.label()} in {outcome.seconds:.1f} s,"
            f" {outcome.sends} sends{'; ' + '; '.join(drive.notes) if drive.notes else ''}"
        )
        for violation in violations[:12]:
            self.out("VIOLATION: " + violation)
        return outcome


class _Drive:
    """One scenario: sends, the fault, the wait and the check."""

    def __init__(self, runner: Runner, index: int, scenario: Scenario) -> None:
        self.runner, self.index, self.scenario = runner, index, scenario
        self.transport = runner.transport(scenario.transport)
        self.tag = f"s{index}-{uuid.uuid4().hex[:6]}"
        self.key = f"{self.tag}-k"
        self.sends: list[Send] = []
        self.faults = Faults()
        self.notes: list[str] = []
        self.violations: list[str] = []
        self._count = 0
        self._delayed = 0

    # -- sends --------------------------------------------------------------------------------

    def _task_name(self, index: int) -> str:
        kind = self.scenario.kind
        if kind == "named":
            return NAMED_TASK
        if kind in ("read", "write"):
            first, other = ("sc.read", "sc.write") if kind == "read" else ("sc.write", "sc.read")
            return other if index == 2 else first
        if kind == "range":  # two shared ranges that overlap, and an exclusive one over both
            return "sc.range" if index == 2 else "sc.range_read"
        return KIND_OPTIONS[kind][0]

    def _kwargs(self, index: int, seconds: float, plan: dict[str, Any]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"seconds": seconds, "plan": plan}
        if self.scenario.kind == "range":
            kwargs["lo"], kwargs["hi"] = [(0, 10), (5, 15), (8, 20)][index]
        if self.scenario.kind == "keys":
            names = [self.key, f"{self.key}b", f"{self.key}c", f"{self.key}d"]
            kwargs["other"] = names[index + 1]
            return {**kwargs, "key": names[index]}
        return {**kwargs, "key": self.key}

    def _new_send(self, index: int, seconds: float, plan: dict[str, Any]) -> tuple[Send, Any]:
        self._count += 1
        task_id = str(uuid.uuid4())
        if self.scenario.feature == "odd_task_id":
            task_id += "}:lock"  # a task id that looks like the end of a lock key
        send = Send(f"{self.tag}.{self._count}", task_id, self._task_name(index), plan)
        task = self.transport.app.tasks[send.task]
        kwargs = self._kwargs(index, seconds, plan)
        key = kwargs.pop("key")
        signature = task.si(key, send=send.send, **kwargs).set(task_id=send.task_id)
        self.sends.append(send)
        return send, signature

    def _apply(self, send: Send, signature: Any, **options: Any) -> None:
        try:
            result = signature.apply_async(**options)
        except DuplicateTask as exc:
            send.refused = repr(exc)
            return
        if result.id != send.task_id:
            send.dedup_of = result.id

    def _plain(self, index: int, seconds: float = SHORT, **options: Any) -> Send:
        send, signature = self._new_send(index, seconds, {})
        self._apply(send, signature, **options)
        return send

    def send_calls(self) -> None:
        feature = self.scenario.feature
        plans = {
            "retry": {"retry": True},
            "autoretry": {"autoretry": True},
            "retry_nothrow": {"retry_nothrow": True},
            "replace": {"replace": True},
            "resend_failed": {"fail": True},
        }
        seconds = FIRST
        if feature == "redelivery" and self.scenario.transport == "redis":
            seconds = VISIBILITY_TIMEOUT + 2.5  # delivered again while it runs
        if feature in ("chain", "group", "chord"):
            first, sig0 = self._new_send(0, seconds, {})
            second, sig1 = self._new_send(1, SHORT, {})
            if feature == "chain":
                second.after = first.send
                chain(sig0, sig1).apply_async()
            elif feature == "group":
                group(sig0, sig1).apply_async()
            else:
                self._count += 1
                callback = Send(f"{self.tag}.{self._count}", str(uuid.uuid4()), "sc.collect")
                callback.members = [first.send, second.send]
                self.sends.append(callback)
                body = self.transport.app.tasks["sc.collect"].s(send=callback.send)
                chord([sig0, sig1])(body.set(task_id=callback.task_id))
            self._plain(2)
            return
        if feature == "revoke":
            send = self._plain(0, seconds, countdown=3)
            send.revoked = True
            self.transport.app.control.revoke(send.task_id)
            self._plain(1)
            self._plain(2)
            return
        first, sig0 = self._new_send(0, seconds, plans.get(feature, {}))
        self._apply(first, sig0)
        if first.dedup_of is None and first.refused is None:
            # The first call takes the key before the others come: its feature is the one
            # exercised, and the faults hit its run.
            self._wait(
                lambda: any(e["event"] == "start" for e in self._events()),
                RUN_START_TIMEOUT,
                "the first call to start",
            )
        if feature == "countdown":
            self._plain(1, countdown=1)
            self._plain(2, eta=datetime.now(timezone.utc) + timedelta(seconds=1.5))
        else:
            self._plain(1)
            self._plain(2)

    def resend(self) -> None:
        """Re-send the first call's task id once it ended (``resend_*``)."""
        first = self.sends[0]
        if first.dedup_of or first.refused:
            self.notes.append("no re-send: the first call was deduplicated")
            return
        self._wait(lambda: self._settled({first.send}), OUTCOME_TIMEOUT, "the first call's end")
        self._count += 1
        send = Send(f"{self.tag}.{self._count}", first.task_id, first.task, {})
        send.resend_of = first.send
        self.sends.append(send)
        task = self.transport.app.tasks[send.task]
        kwargs = self._kwargs(0, SHORT, {})
        key = kwargs.pop("key")
        self._apply(send, task.si(key, send=send.send, **kwargs).set(task_id=send.task_id))

    # -- faults ---------------------------------------------------------------------------------

    def _running_pid(self) -> int | None:
        """The pid of a run in progress, the first send's if it runs."""
        runs, _ = _runs(self._events(), self.faults)
        running = sorted((r for r in runs if r.end is None), key=lambda r: r.send)
        return running[0].pid if running else None

    def inject(self) -> None:
        fault, runner = self.scenario.fault, self.runner
        if fault == "none":
            return
        if fault == "late_reply":
            self._delayed = runner.proxy.delayed
            runner.proxy.delay_next_script(REPLY_DELAY)
            return
        pid = self._wait(self._running_pid, RUN_START_TIMEOUT, "a run to start", fail=False)
        if pid is None:
            self.notes.append(f"fault {fault} not injected: no run started")
            return
        worker = self.transport.worker
        assert worker is not None
        if fault == "kill_child":
            before = runner.now()
            _signal(pid, signal.SIGKILL)
            self.faults.kills.append((before, runner.now(), {pid}))
        elif fault in ("kill_worker", "restart_same_name"):
            before = runner.now()
            self.faults.worker_kills.append(before)
            pids = {worker.pid, *worker.children()}
            worker.kill()
            self.faults.kills.append((before, runner.now(), pids))
            self.transport.start(worker.name if fault == "restart_same_name" else None)
        elif fault == "pause":
            stopped = runner.now()
            _signal(pid, signal.SIGSTOP)
            # The fault itself: the holder stays stopped past its lease.
            time.sleep(LEASE + 1.5)
            _signal(pid, signal.SIGCONT)
            self.faults.pauses.append((pid, stopped, runner.now()))
        elif fault == "redis_restart":
            stopped = runner.now()
            runner.lock.stop()
            time.sleep(0.5)  # the outage itself
            runner.lock.start()
            self.faults.restarts.append((stopped, runner.now()))

    # -- waiting and the history -----------------------------------------------------------------

    def _events(self) -> list[dict[str, Any]]:
        ids = {s.task_id for s in self.sends}
        return [
            e
            for e in self.runner.events()
            if str(e.get("send") or "").startswith(f"{self.tag}.") or e.get("task_id") in ids
        ]

    def _states(self) -> dict[str, tuple[str, Any]]:
        states = {}
        for task_id in {s.task_id for s in self.sends}:
            result = self.transport.app.AsyncResult(task_id)
            states[task_id] = (str(result.state), result.result)
        return states

    def _settled(self, sends: set[str]) -> bool:
        history = self.history()
        problems = _check_outcomes(history, *_runs(history.events, self.faults))
        # A send is awaited while it has no outcome or its result is not stored yet.
        waiting = ("has no outcome", "the backend holds")
        return not any(send in sends and any(w in p for w in waiting) for send, p in problems)

    def _idle(self) -> bool:
        runs, _ = _runs(self._events(), self.faults)
        if any(r.end is None and _alive(r.pid) for r in runs):
            return False
        return self.transport.queued() == 0

    def _wait(self, probe: Callable[[], Any], timeout: float, what: str, fail: bool = True) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                if fail:
                    self.notes.append(f"timed out after {timeout:.0f} s waiting for {what}")
                return None
            time.sleep(0.1)

    def history(self) -> ScenarioHistory:
        return ScenarioHistory(
            self.scenario, list(self.sends), self._events(), self._states(), self.faults
        )

    def go(self) -> None:
        self.transport.ensure()
        if self.scenario.fault == "late_reply":
            self.inject()
        self.send_calls()
        if self.scenario.fault != "late_reply":
            self.inject()
        if self.scenario.feature in ("resend_ok", "resend_failed"):
            self.resend()
        all_sends = {s.send for s in self.sends}
        self._wait(lambda: self._settled(all_sends), OUTCOME_TIMEOUT, "every send's outcome")
        # Nothing left running or queued, twice a poll apart (a popped message is in neither
        # list for a moment).
        quiet = [0]

        def calm() -> bool:
            quiet[0] = quiet[0] + 1 if self._idle() else 0
            return quiet[0] >= 2

        self._wait(calm, OUTCOME_TIMEOUT, "nothing left running or queued")
        if self.scenario.fault == "late_reply":
            held = self.runner.proxy.delayed - self._delayed
            self.notes.append(f"{held} script repl{'y' if held == 1 else 'ies'} held back")
        self.violations += check(self.history())


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rpartition(b")")[2].split()[:1] != [b"Z"]


def run_scenarios(
    seed: int,
    scenarios: Sequence[tuple[int, Scenario]],
    *,
    budget: float | None = None,
    log_dir: Path | None = None,
    out: Callable[[str], Any] = print,
) -> list[Outcome]:
    """Run ``scenarios`` (index, scenario) in order, on one set of servers; stop starting
    new ones once ``budget`` seconds have passed."""
    outcomes = []
    began = time.monotonic()
    with Runner(seed, log_dir, out) as runner:
        out(f"worker logs in {runner.log_dir}")
        for index, scenario in scenarios:
            if budget is not None and time.monotonic() - began > budget:
                out(f"budget of {budget:.0f} s spent: {len(outcomes)} scenarios run")
                break
            outcomes.append(runner.run(index, scenario))
    return outcomes
