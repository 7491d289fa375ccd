"""Chaos check of mutual exclusion with real ``celery worker`` processes (the library; the
soak driver is tests/chaos.py, the suite's short run tests/test_chaos.py).

Several prefork workers run many ``fault.chaos`` tasks (tests/apps/fault_app.py) on a few keys
while this driver SIGKILLs pool children and whole workers (replacing them), SIGSTOPs holders
past their lease and SIGCONTs them, and restarts the LOCK Redis (empty). The broker, the
records and the fenced store live on a second Redis that is never touched, so a restart
cannot wipe the evidence.

Every run makes a fenced ``begin`` write, works, and a fenced ``commit`` write (regardless of
whether its lease was lost, as a write already under way would be). The checker then proves:

- accepted writes of a key carry non-decreasing tokens, equal only within one execution;
- no two ACCEPTED runs of a key (begin and commit both accepted) overlap in store time;
- raw execution overlap (two runs of a key running at once) happens only where the earlier
  run was SIGSTOPped or the lock Redis restarted under it, and so does every rejected write:
  an undisturbed holder is never overlapped nor fenced off;
- no run is lost: every run sent completes in the end (killed runs are redelivered:
  ``acks_late``), except one a killed process had received.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import signal
import subprocess
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from apps.fault_app import CHAOS_LEASE, events_key, make_app, server_time, store_keys

from celery_singleton_lock.embedded import RedisServer
from support.waiting import start_celery_worker

START_TIMEOUT = 90.0
#: The faults the driver injects: kill a pool child, pause a holder past its lease, restart
#: the lock Redis empty, kill a whole worker.
FAULTS = ["kill_child", "pause", "restart", "kill_worker"]


# -- workers ------------------------------------------------------------------------------------


@dataclass
class Worker:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def children(self) -> list[int]:
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the process group: the main process and its pool children."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(30)

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


class Workers:
    """``celery -A fault_app worker`` programs on one lock server, broker and prefix."""

    def __init__(self, lock_url: str, broker_url: str, prefix: str, log_dir: Path) -> None:
        self.lock_url, self.broker_url, self.prefix = lock_url, broker_url, prefix
        self.tag = uuid.uuid4().hex[:8]
        self.queue = f"csltest-{self.tag}"
        self.log_dir = log_dir
        self.app = make_app(lock_url, broker_url, prefix, self.queue)
        self.broker = redis.Redis.from_url(broker_url)
        self.workers: list[Worker] = []
        self._count = 0

    def start(self, concurrency: int = 2, name: str | None = None) -> Worker:
        """A new worker; ``name``: its node name (default: one of its own)."""
        self._count += 1
        name = name or f"w{self._count}-{self.tag}@localhost"
        log = self.log_dir / f"w{self._count}-{self.tag}.log"
        env = {
            **os.environ,
            "CSL_FAULT_LOCK_URL": self.lock_url,
            "CSL_FAULT_BROKER_URL": self.broker_url,
            "CSL_FAULT_PREFIX": self.prefix,
            "CSL_FAULT_QUEUE": self.queue,
        }
        process = start_celery_worker(
            "apps.fault_app", queues=[self.queue], name=name, env=env, log=log,
            concurrency=concurrency,
        )  # fmt: skip
        worker = Worker(name, process, log)
        self.workers.append(worker)
        return worker

    def wait_ready(self, *workers: Worker, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        pending = {worker.name: worker for worker in workers}
        while pending:
            for worker in pending.values():
                if not worker.alive():
                    raise RuntimeError(f"worker {worker.name} exited:\n{worker.log_tail()}")
            for reply in self.app.control.ping(destination=list(pending), timeout=0.5):
                for name in reply:
                    pending.pop(name, None)
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"workers {sorted(pending)} did not answer in {timeout} s")

    def close(self) -> None:
        for worker in self.workers:
            if worker.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.pid, signal.SIGCONT)
                worker.kill()
        client = getattr(self.app, "_singleton_lock_client", None)
        if client is not None:
            client.close()
        self.broker.close()

    def events(self, start: int = 0) -> list[dict[str, Any]]:
        raw = self.broker.lrange(events_key(self.prefix), start, -1)
        return [json.loads(item) for item in raw]


# -- the report ---------------------------------------------------------------------------------


@dataclass
class Report:
    seconds: float
    runs_sent: int = 0
    runs_completed: int = 0
    executions: int = 0
    accepted_runs: int = 0
    accepted_writes: int = 0
    rejected_writes: int = 0
    raw_overlaps: int = 0
    child_kills: int = 0
    worker_kills: int = 0
    killed_mid_run: int = 0
    pauses: int = 0
    restarts: int = 0
    lost_signals: int = 0
    lost_runs: int = 0
    broker_dropped: int = 0
    violations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"chaos {self.seconds:.0f} s: runs={self.runs_sent} completed={self.runs_completed}"
            f" executions={self.executions} accepted_runs={self.accepted_runs}"
            f" accepted_writes={self.accepted_writes} rejected_writes={self.rejected_writes}"
            f" raw_overlaps={self.raw_overlaps} child_kills={self.child_kills}"
            f" worker_kills={self.worker_kills} killed_mid_run={self.killed_mid_run}"
            f" pauses={self.pauses} restarts={self.restarts} lock_lost={self.lost_signals}"
            f" lost_runs={self.lost_runs} broker_dropped={self.broker_dropped}"
            f" violations={len(self.violations)}"
        )


# -- the driver ---------------------------------------------------------------------------------


@dataclass
class Faults:
    kills: list[tuple[float, set[int]]] = field(default_factory=list)
    pauses: list[tuple[int, float, float]] = field(default_factory=list)
    restarts: list[tuple[float, float]] = field(default_factory=list)


def run_chaos(
    seconds: float,
    *,
    workers: int = 3,
    keys: int = 3,
    in_flight: int = 8,
    seed: int | None = None,
    log_dir: Path | None = None,
    drain_timeout: float = 90.0,
    out: Any = print,
) -> Report:
    rng = random.Random(seed)
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="csl-chaos-"))
    prefix = f"csltest:{uuid.uuid4().hex[:12]}:"
    report = Report(seconds)
    faults = Faults()
    with RedisServer() as broker_server, RedisServer() as lock_server:
        pool = Workers(lock_server.url, broker_server.url, prefix, log_dir)
        try:
            started = [pool.start() for _ in range(workers)]
            pool.wait_ready(*started)
            chaos = pool.app.tasks["fault.chaos"]
            broker = pool.broker
            sent: dict[str, str] = {}  # run id -> key
            ended: set[str] = set()
            running: dict[int, float] = {}  # pid -> start time of its open execution
            offset = 0
            paused: list[tuple[int, float, float]] = []  # pid, stopped at (server), cont at
            next_fault = time.monotonic() + rng.uniform(1.0, 2.5)
            unseen = list(FAULTS)
            rng.shuffle(unseen)
            end = time.monotonic() + seconds

            def poll() -> None:
                nonlocal offset
                new = pool.events(offset)
                offset += len(new)
                for event in new:
                    if event["event"] == "start" and "run" in event:
                        running[event["pid"]] = event["time"]
                    elif event["event"] == "end" and "run" in event:
                        running.pop(event["pid"], None)
                        ended.add(event["run"])

            def resume_due(force: bool = False) -> None:
                for item in list(paused):
                    pid, stopped_at, cont_at = item
                    if force or time.monotonic() >= cont_at:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGCONT)
                        faults.pauses.append((pid, stopped_at, server_time(broker)))
                        paused.remove(item)

            def live_workers() -> list[Worker]:
                return [w for w in pool.workers if w.alive()]

            while time.monotonic() < end:
                poll()
                resume_due()
                while len(sent) - len(ended & sent.keys()) < in_flight:
                    run = uuid.uuid4().hex[:10]
                    key = f"k{rng.randrange(keys)}"
                    sent[run] = key
                    chaos.apply_async((key, run, rng.uniform(0.05, 0.4)))
                if time.monotonic() >= next_fault:
                    next_fault = time.monotonic() + rng.uniform(1.5, 3.0)
                    holders = [pid for pid in running if pid not in {p for p, _, _ in paused}]
                    # Every kind of fault at least once (the test asserts each happened),
                    # then at random: a short run must not depend on the seed's luck.
                    fault = (
                        next(
                            (f for f in unseen if holders or f in ("restart", "kill_worker")), None
                        )
                        or rng.choices(FAULTS, [3, 3, 2, 1])[0]
                    )
                    if fault in unseen:
                        unseen.remove(fault)
                    if fault == "kill_child" and holders:
                        pid = rng.choice(holders)
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                        faults.kills.append((server_time(broker), {pid}))
                        report.child_kills += 1
                    elif fault == "pause" and holders:
                        pid = rng.choice(holders)
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGSTOP)
                        cont_at = time.monotonic() + CHAOS_LEASE + rng.uniform(0.5, 1.5)
                        paused.append((pid, server_time(broker), cont_at))
                    elif fault == "restart":
                        stopped_at = server_time(broker)
                        lock_server.stop()
                        time.sleep(rng.uniform(0.2, 1.5))  # the outage itself
                        lock_server.start()
                        faults.restarts.append((stopped_at, server_time(broker)))
                    elif fault == "kill_worker" and live_workers():
                        victim = rng.choice(live_workers())
                        pids = {victim.pid, *victim.children()}
                        victim.kill()
                        faults.kills.append((server_time(broker), pids))
                        report.worker_kills += 1
                        pool.start()  # keep the capacity; it joins while the chaos goes on
                time.sleep(0.05)  # pacing of the driver

            # Calm: everything resumed, the lock server up, every worker up; drain.
            resume_due(force=True)
            lock_server.start()
            pool.wait_ready(*live_workers())
            deadline = time.monotonic() + drain_timeout
            while time.monotonic() < deadline and not sent.keys() <= ended:
                poll()
                time.sleep(0.1)
            poll()
            report.pauses = len(faults.pauses)
            report.restarts = len(faults.restarts)
            check(pool, sent, ended, faults, report)
        finally:
            pool.close()
    out(report.summary())
    for violation in report.violations[:20]:
        out("VIOLATION: " + violation)
    return report


# -- the checker --------------------------------------------------------------------------------


def _overlaps(a0: float, a1: float, b0: float, b1: float) -> bool:
    return a0 < b1 and b0 < a1


def check(
    pool: Workers, sent: dict[str, str], ended: set[str], faults: Faults, report: Report
) -> None:
    events = pool.events()
    starts = {e["execution"]: e for e in events if e["event"] == "start" and "execution" in e}
    ends = {e["execution"]: e for e in events if e["event"] == "end" and "execution" in e}
    received: dict[tuple[str, int], list[float]] = defaultdict(list)
    for e in events:
        if e["event"] == "received":
            received[(e["task_id"], e["pid"])].append(e["time"])
    report.lost_signals = sum(1 for e in events if e["event"] == "lost")
    report.runs_sent = len(sent)
    report.runs_completed = len(sent.keys() & ended)
    report.executions = len(starts)
    killed = {pid: at for at, pids in faults.kills for pid in pids}
    broker = pool.broker

    def began(execution: str) -> float:
        start = starts[execution]
        times = [
            t for t in received.get((start["task_id"], start["pid"]), []) if t <= start["time"]
        ]
        return max(times) if times else start["time"]

    def excused(execution: str, until: float) -> bool:
        """Paused, or the lock server restarted, while this execution ran."""
        pid, since = starts[execution]["pid"], began(execution)
        if any(p == pid and _overlaps(since, until, s, c) for p, s, c in faults.pauses):
            return True
        return any(_overlaps(since, until, s, c) for s, c in faults.restarts)

    # Executions that never ended were killed; anything else vanished.
    for execution, start in starts.items():
        if execution not in ends:
            if start["pid"] in killed:
                report.killed_mid_run += 1
            else:
                report.violations.append(f"execution {execution} started and never ended")

    for key in sorted(set(sent.values())):
        _, accepted_key, rejected_key = store_keys(pool.prefix, key)
        accepted = [entry.decode().split() for entry in broker.lrange(accepted_key, 0, -1)]
        rejected = [entry.decode().split() for entry in broker.lrange(rejected_key, 0, -1)]
        report.accepted_writes += len(accepted)
        report.rejected_writes += len(rejected)
        # 1. Tokens of accepted writes never go down; equal only within one execution.
        for (token0, exe0, _, _), (token1, exe1, _, _) in zip(accepted, accepted[1:], strict=False):
            if int(token1) < int(token0) or (int(token1) == int(token0) and exe1 != exe0):
                report.violations.append(f"{key}: accepted {exe1} token {token1} after {token0}")
        # 2. Accepted runs (begin and commit both accepted) never overlap in store time.
        spans: dict[str, dict[str, float]] = defaultdict(dict)
        for _, execution, op, at in accepted:
            spans[execution][op] = float(at)
        runs = sorted(
            (span["begin"], span["commit"], execution)
            for execution, span in spans.items()
            if "begin" in span and "commit" in span
        )
        report.accepted_runs += len(runs)
        for (_, end0, exe0), (begin1, _, exe1) in zip(runs, runs[1:], strict=False):
            if begin1 < end0:
                report.violations.append(f"{key}: accepted runs {exe0} and {exe1} overlap")
        # 3. Every rejected write comes from a disturbed execution.
        for _, execution, op, at in rejected:
            if execution not in starts or not excused(execution, float(at)):
                report.violations.append(f"{key}: {op} of undisturbed {execution} was rejected")
        # 4. Raw overlap only where the earlier execution was disturbed.
        done = sorted(
            (starts[x]["time"], ends[x]["time"], x)
            for x in ends
            if x in starts and starts[x]["key"] == key
        )
        for i, (start1, _, exe1) in enumerate(done):
            for start0, end0, exe0 in done[:i]:
                if end0 > start1:
                    report.raw_overlaps += 1
                    if not excused(exe0, end0):
                        report.violations.append(
                            f"{key}: undisturbed {exe0} overlapped by {exe1} ({start0}-{end0},"
                            f" {start1})"
                        )
    # Killed runs are redelivered (acks_late) and normally complete; one that never did is
    # excused only if a killed process had received it. A run nobody received is lost.
    received_by = defaultdict(set)
    for e in events:
        if e["event"] == "received" and e.get("run"):
            received_by[e["run"]].add(e["pid"])
    unfinished = sorted(set(sent) - ended)
    lost = [run for run in unfinished if not received_by[run] & killed.keys()]
    report.killed_mid_run += len(unfinished) - len(lost)
    # A run no process ever received, after whole workers were SIGKILLed, was dropped by
    # the broker: Kombu's Redis transport pops a message (BRPOP) before it records it as
    # unacked, and a worker killed in between takes the message with it. That is the
    # broker's delivery guarantee, not the lock's; it is counted and shown, not excused
    # silently, and without worker kills it stays a violation.
    if report.worker_kills:
        waiting = _runs_in_broker(broker, pool.queue)
        dropped = [run for run in lost if not received_by[run] and run not in waiting]
        report.broker_dropped = len(dropped)
        lost = [run for run in lost if run not in dropped]
    report.lost_runs = len(lost)
    for run in lost[:10]:
        story = [
            f"{e['event']}@{e['time']:.3f} pid={e['pid']}"
            + (f" token={e['token']}" if e.get("token") else "")
            for e in events
            if e.get("run") == run
        ]
        report.violations.append(
            f"run {run} ({sent[run]}) was never completed nor killed: {', '.join(story)}"
        )


def _runs_in_broker(broker: Any, queue: str) -> set[str]:
    """Run ids of the messages still queued or unacked in Kombu's Redis transport."""
    raw = list(broker.lrange(queue, 0, -1)) + list(broker.hvals("unacked"))
    runs = set()
    for item in raw:
        payload = json.loads(item)
        if isinstance(payload, list):  # unacked entries are [message, exchange, routing key]
            payload = payload[0]
        args = json.loads(base64.b64decode(payload["body"]))[0]
        if len(args) > 1:
            runs.add(args[1])
    return runs
