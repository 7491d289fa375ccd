"""Chaos history check with real ``celery worker`` processes (the library; the soak driver is
tests/chaos.py, the suite's short run tests/tasks/test_chaos.py).

Several prefork workers run many calls of the ``fault.chaos`` and ``fault.chaos_skip`` tasks
(tests/apps/fault_app.py) on a few keys while this driver SIGKILLs pool children and whole
workers (replacing them), SIGSTOPs holders past their lease and SIGCONTs them, restarts the
LOCK Redis (empty), and holds back the reply of a script call past the client's socket
timeout (the lock Redis is reached through a delaying proxy: the script ran, the caller saw
a timeout and tries again). The broker, the result backend, the records and the fenced store
live on a second Redis, the evidence Redis, that is never touched, so a restart cannot wipe
the evidence.

Every call sent is tracked by its task id; every run of it records its start and end (with
its fencing token, worker, pid and attempt) and makes a fenced ``begin`` and ``commit``
write. support/history.py checks the history.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from apps.fault_app import CHAOS_LEASE, events_key, make_app, server_time, store_keys

from celery_singleton_lock.celery.app_client import close_lock_client
from celery_singleton_lock.embedded import RedisServer
from support.history import Call, Faults, History, Report, check
from support.proxies import DelayingProxy
from support.waiting import start_celery_worker

START_TIMEOUT = 90.0
#: The faults the driver injects in turn: kill a pool child, pause a holder past its lease,
#: restart the lock Redis empty, kill a whole worker.
FAULTS = ["kill_child", "pause", "restart", "kill_worker"]
#: How often each fault is drawn once every kind has happened.
FAULT_WEIGHTS = [3, 3, 2, 1]
#: The workers' socket timeout on the lock Redis, and how long a held-back reply waits: past
#: the timeout, well within the lease (the heartbeat tries again in time).
SOCKET_TIMEOUT = 1.0
REPLY_DELAY = 1.5
#: Seconds between two held-back replies (drawn in this range). The fault destroys nothing,
#: so it comes on its own, more often than the others: only a delay that hits an acquire
#: whose take went through tests the calls' fate.
REPLY_DELAY_EVERY = (0.5, 2.0)
#: Seconds a call sent counts as in flight at most: a call's wait for its key (15 s) and a
#: few retries.
IN_FLIGHT_FOR = 30.0
#: One call in this many is a ``fault.chaos_skip`` call.
SKIP_EVERY = 4


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
        """SIGKILL the process group: the main process and its pool children, continued
        first where a fault paused them (SIGSTOP)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGCONT)
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
        close_lock_client(self.app)
        self.broker.close()

    def events(self, start: int = 0) -> list[dict[str, Any]]:
        raw = self.broker.lrange(events_key(self.prefix), start, -1)
        return [json.loads(item) for item in raw]


# -- the driver ---------------------------------------------------------------------------------


class Progress:
    """The calls' progress as the workers record it on the evidence Redis, read as it comes."""

    def __init__(self, pool: Workers) -> None:
        self.pool = pool
        self.settled: set[str] = set()  # task ids whose delivery ended with a final state
        self.running: dict[int, float] = {}  # pid -> start time of its open run
        self.open_runs: dict[str, int] = {}  # execution -> pid, of runs started and not ended
        self._offset = 0

    def poll(self) -> None:
        new = self.pool.events(self._offset)
        self._offset += len(new)
        for event in new:
            if event["event"] == "start":
                self.running[event["pid"]] = event["time"]
                self.open_runs[event["execution"]] = event["pid"]
            elif event["event"] == "end":
                self.running.pop(event["pid"], None)
                self.open_runs.pop(event["execution"], None)
            elif event["event"] == "outcome" and event["state"] in FINAL_STATES:
                self.settled.add(event["task_id"])

    def drain(self, calls: dict[str, Call], timeout: float) -> None:
        """Wait (up to ``timeout`` seconds) until the history can be read whole.

        Every call settled is not enough: a call's message may be delivered twice (a
        visibility timeout runs out while its first delivery waits for the key), and the
        second delivery may start its run just as the first one's result settles the call.
        So also until no run is open in a live process and the broker holds no message
        that could start another run: a run still going when the history is read would be
        taken for one that never ended."""
        deadline = time.monotonic() + timeout
        quiet = 0  # polls in a row that found nothing unsettled, running or queued
        while time.monotonic() < deadline and quiet < 2:
            self.poll()
            idle = calls.keys() <= self.settled and not any(
                _alive(pid) for pid in self.open_runs.values()
            )
            quiet = quiet + 1 if idle and _broker_empty(self.pool.broker, self.pool.queue) else 0
            time.sleep(0.1)


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
        proxy = DelayingProxy(lock_server.port)
        lock_url = f"{proxy.url}?socket_timeout={SOCKET_TIMEOUT}"
        pool = Workers(lock_url, broker_server.url, prefix, log_dir)
        try:
            started = [pool.start() for _ in range(workers)]
            pool.wait_ready(*started)
            tasks = [pool.app.tasks["fault.chaos"], pool.app.tasks["fault.chaos_skip"]]
            broker = pool.broker
            calls: dict[str, Call] = {}  # task id -> the call sent
            progress = Progress(pool)
            sent_at: dict[str, float] = {}  # task id -> when sent (monotonic)
            paused: list[tuple[int, float, float]] = []  # pid, stopped at (server), cont at
            next_fault = time.monotonic() + rng.uniform(1.0, 2.5)
            next_delay = time.monotonic() + rng.uniform(*REPLY_DELAY_EVERY)
            unseen = list(FAULTS)
            rng.shuffle(unseen)
            end = time.monotonic() + seconds

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

            def kill(pids: set[int], how: Any) -> None:
                before = server_time(broker)
                how()
                faults.kills.append((before, server_time(broker), pids))

            while time.monotonic() < end:
                progress.poll()
                resume_due()
                # A call unsettled for long is lost or stuck (the check says which at the
                # end): it no longer takes a place, so that lost calls cannot stop the chaos.
                recent = time.monotonic() - IN_FLIGHT_FOR
                pending = [
                    t for t, at in sent_at.items() if at > recent and t not in progress.settled
                ]
                for _ in range(in_flight - len(pending)):
                    key = f"k{rng.randrange(keys)}"
                    task = tasks[1] if rng.randrange(SKIP_EVERY) == 0 else tasks[0]
                    result = task.apply_async((key, rng.uniform(0.05, 0.4)))
                    calls[result.id] = Call(key, task.name)
                    sent_at[result.id] = time.monotonic()
                if time.monotonic() >= next_delay:
                    next_delay = time.monotonic() + rng.uniform(*REPLY_DELAY_EVERY)
                    proxy.delay_next_script(REPLY_DELAY)
                if time.monotonic() >= next_fault:
                    next_fault = time.monotonic() + rng.uniform(1.5, 3.0)
                    holders = [
                        pid for pid in progress.running if pid not in {p for p, _, _ in paused}
                    ]
                    # Every kind of fault at least once (the test asserts each happened),
                    # then at random: a short run must not depend on the seed's luck.
                    fault = (
                        next((f for f in unseen if holders or f not in NEED_HOLDER), None)
                        or rng.choices(FAULTS, FAULT_WEIGHTS)[0]
                    )
                    if fault in unseen:
                        unseen.remove(fault)
                    if fault == "kill_child" and holders:
                        pid = rng.choice(holders)
                        kill({pid}, functools.partial(_signal, pid, signal.SIGKILL))
                        report.child_kills += 1
                    elif fault == "pause" and holders:
                        pid = rng.choice(holders)
                        _signal(pid, signal.SIGSTOP)
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
                        faults.worker_kills.append(server_time(broker))
                        kill({victim.pid, *victim.children()}, victim.kill)
                        report.worker_kills += 1
                        pool.start()  # keep the capacity; it joins while the chaos goes on
                time.sleep(0.05)  # pacing of the driver

            # Calm: everything resumed, the lock server up, every worker up; drain.
            resume_due(force=True)
            lock_server.start()
            pool.wait_ready(*live_workers())
            progress.drain(calls, drain_timeout)
            faults.reply_delays = proxy.delayed
            history = _history(pool, calls, faults)
            check(history, report)
        finally:
            pool.close()
            proxy.close()
    out(report.summary())
    for dropped in report.dropped[:10]:
        out("BROKER DROPPED: " + dropped)
    for violation in report.violations[:30]:
        out("VIOLATION: " + violation)
    return report


#: Faults that need a run in progress to hit.
NEED_HOLDER = ("kill_child", "pause")
#: Delivery states after which a call is not run again.
FINAL_STATES = ("SUCCESS", "FAILURE", "REVOKED")


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs code: it exists and is not a zombie (a killed
    worker's children may stay zombies until reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    # "pid (comm) state ...": comm may hold spaces and parentheses, so after the last ')'.
    return stat.rpartition(b")")[2].split()[:1] != [b"Z"]


def _broker_empty(broker: Any, queue: str) -> bool:
    """No message queued nor unacked (Kombu's Redis transport). A message a worker popped
    is in neither until its unacked record is written, a moment later in the same step of
    that worker: the caller asks twice, a poll apart."""
    return broker.llen(queue) == 0 and broker.hlen("unacked") == 0


def _history(pool: Workers, calls: dict[str, Call], faults: Faults) -> History:
    """Everything the check reads, gathered from the evidence Redis at the end."""
    broker = pool.broker
    accepted, rejected = {}, {}
    for key in {call.key for call in calls.values()}:
        _, accepted_key, rejected_key = store_keys(pool.prefix, key)
        accepted[key] = [entry.decode().split() for entry in broker.lrange(accepted_key, 0, -1)]
        rejected[key] = [entry.decode().split() for entry in broker.lrange(rejected_key, 0, -1)]
    return History(
        calls=calls,
        events=pool.events(),
        accepted=accepted,
        rejected=rejected,
        states={task_id: str(pool.app.AsyncResult(task_id).state) for task_id in calls},
        in_broker=_calls_in_broker(broker, pool.queue),
        faults=faults,
    )


def _calls_in_broker(broker: Any, queue: str) -> set[str]:
    """Task ids of the messages still queued or unacked in Kombu's Redis transport."""
    raw = list(broker.lrange(queue, 0, -1)) + list(broker.hvals("unacked"))
    task_ids = set()
    for item in raw:
        payload = json.loads(item)
        if isinstance(payload, list):  # unacked entries are [message, exchange, routing key]
            payload = payload[0]
        task_ids.add(payload["headers"]["id"])
    return task_ids
