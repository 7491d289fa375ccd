"""SingletonTask on every worker pool, and every way a worker stops.

In-process workers (threads pool) show that the worker step frees locks only after the pool
has stopped. Real ``celery worker`` subprocesses (``pool_app.py``) run the matrix over the
prefork, threads, solo, gevent and eventlet pools: mutual exclusion under four-way
concurrency, a SIGKILLed worker freed within the lease, warm and cold shutdown, and a
CPU-bound body under gevent/eventlet that starves the heartbeat.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apps.pool_app import LEASE, RECORD_TTL, gate_key, make_app
from celery import Celery
from celery._state import _set_task_join_will_block
from celery.contrib.testing.worker import TestWorkController, setup_app_for_worker, start_worker
from celery.worker.components import Pool
from support.waiting import wait_for
from support.workers import WorkerProgram as PoolWorker
from support.workers import WorkerPrograms

from celery_singleton_lock import LockClient, SingletonTask, lock_released
from celery_singleton_lock.celery.worker import SingletonLockStep, install, release_all_held
from celery_singleton_lock.core.holder import flatten
from celery_singleton_lock.core.keys import lock_keys

TIMEOUT = 30.0


# -- the worker step's place --------------------------------------------------------------------


def step_index(worker: Any, kind: type) -> int:
    return next(i for i, step in enumerate(worker.steps) if isinstance(step, kind))


def test_the_step_starts_before_the_pool_so_it_stops_after_it(celery_lock_app: Celery) -> None:
    install(celery_lock_app)
    worker = celery_lock_app.WorkController(
        pool="threads", concurrency=1, without_heartbeat=True, without_mingle=True,
        without_gossip=True,
    )  # fmt: skip
    assert step_index(worker, SingletonLockStep) < step_index(worker, Pool)
    # Steps that do not depend on each other come in set order, which changes from one
    # process to the next: the step also finds its place when it is included after the pool.
    step = worker.steps.pop(step_index(worker, SingletonLockStep))
    assert step.include(worker)
    assert step_index(worker, SingletonLockStep) == step_index(worker, Pool) - 1


class Gate:
    """A task of the app that holds its lock until the test opens the gate."""

    def __init__(self, app: Celery) -> None:
        self.started = threading.Event()
        self.open = threading.Event()
        self.released: list[str] = []

        @app.task(base=SingletonTask, bind=True, shared=False, lock_key="gate", lock_lease=3)
        def gated(task: Any) -> int:
            self.started.set()
            assert self.open.wait(TIMEOUT), "the test never opened the gate"
            return int(task.lock.token)

        def on_released(sender: Any, task_id: str, **_: Any) -> None:
            if getattr(sender, "name", None) == gated.name:
                self.released.append(task_id)

        lock_released.connect(on_released, weak=False)
        self._on_released = on_released
        self.task = gated

    def close(self) -> None:
        self.open.set()
        lock_released.disconnect(self._on_released)


@pytest.fixture
def gate(celery_lock_app: Celery) -> Iterator[Gate]:
    gate = Gate(celery_lock_app)
    yield gate
    gate.close()


def holder_task_id(client: LockClient, name: str) -> str | None:
    value = flatten(client.redis.hgetall(client.connection.keys(name).lock)).get(b"task_id")
    return value.decode() if value is not None else None


def threads_worker(app: Celery) -> tuple[Any, threading.Thread]:
    """A started threads-pool worker of ``app`` in this process, and the thread running it."""
    setup_app_for_worker(app, "WARNING", None)
    worker = TestWorkController(
        app=app, pool="threads", concurrency=2, without_heartbeat=True, without_mingle=True,
        without_gossip=True, loglevel="WARNING", ready_callback=None,
    )  # fmt: skip
    runner = threading.Thread(target=worker.start, daemon=True)
    runner.start()
    worker.ensure_started()
    _set_task_join_will_block(False)  # as start_worker does: this process is not a worker
    return worker, runner


@pytest.mark.timeout(90)
def test_worker_stop_releases_only_after_the_threads_pool_drained(
    celery_lock_app: Celery, gate: Gate, lock_client: LockClient
) -> None:
    """``WorkController.stop()`` (warm): the running task keeps its lock until it ends.

    Kombu's Redis poller is not thread-safe: a stop from another thread that closes the
    consumer's channels while the event loop iterates them kills the worker at random ("Set
    changed size during iteration"). So the loop is parked in a callback until the stop has
    reached the pool, past every channel."""
    worker, runner = threads_worker(celery_lock_app)
    result = gate.task.delay()
    assert gate.started.wait(TIMEOUT)
    parked = threading.Event()

    def park_the_loop() -> None:
        parked.set()
        deadline = time.monotonic() + TIMEOUT
        while not worker.pool.executor._shutdown and time.monotonic() < deadline:
            time.sleep(0.01)

    worker.hub.call_soon(park_the_loop)
    assert parked.wait(TIMEOUT)
    stopper = threading.Thread(target=worker.stop, daemon=True)
    stopper.start()
    # The threads pool is stopping: it waits for the running task. Every step stopped
    # before it has stopped by now.
    wait_for(lambda: worker.pool.executor._shutdown, TIMEOUT, "the pool to stop")
    assert holder_task_id(lock_client, "gate") == result.id
    assert gate.released == []
    gate.open.set()
    stopper.join(TIMEOUT)
    runner.join(TIMEOUT)
    assert not stopper.is_alive() and not runner.is_alive()
    assert gate.released == [result.id]  # released by the run itself, when it ended
    assert holder_task_id(lock_client, "gate") is None


@pytest.mark.timeout(90)
def test_worker_shutdown_signal_before_the_pool_stopped_releases_nothing(
    celery_lock_app: Celery, gate: Gate, lock_client: LockClient
) -> None:
    """``stop(in_sighandler=True)`` on a pool that is not signal-safe (threads, gevent,
    eventlet) sends ``worker_shutdown`` without stopping anything: the task still runs."""
    worker, runner = threads_worker(celery_lock_app)
    result = gate.task.delay()
    assert gate.started.wait(TIMEOUT)
    worker.stop(in_sighandler=True)
    assert holder_task_id(lock_client, "gate") == result.id
    gate.open.set()
    worker.stop()
    runner.join(TIMEOUT)
    assert not runner.is_alive()
    assert gate.released == [result.id]
    assert holder_task_id(lock_client, "gate") is None


@pytest.mark.timeout(90)
def test_process_shutdown_releases_the_runs_locks_not_the_users_own(
    celery_lock_app: Celery, gate: Gate, lock_client: LockClient
) -> None:
    """``worker_process_shutdown`` (and the step's stop) release the locks runs took, never
    one user code took itself in the same process: that code may still be running."""
    own = lock_client.lease("own", ttl=3, heartbeat=True)
    assert own.acquire(0)
    worker, runner = threads_worker(celery_lock_app)
    try:
        result = gate.task.delay()
        assert gate.started.wait(TIMEOUT)
        assert holder_task_id(lock_client, "gate") == result.id
        release_all_held()
        assert holder_task_id(lock_client, "gate") is None
        assert own.held
        assert lock_client.redis.hget(lock_client.connection.keys("own").lock, "owner") == (
            own.owner.encode()
        )
    finally:
        gate.open.set()
        worker.stop()
        runner.join(TIMEOUT)
    assert not runner.is_alive()
    assert result.get(timeout=TIMEOUT) > 0
    assert gate.released == []  # the run found its lock already released: nothing to send
    assert own.held
    own.release()


@pytest.mark.timeout(90)
def test_start_worker_exit_leaves_a_running_threads_task_its_lock(
    celery_lock_app: Celery, gate: Gate, lock_client: LockClient
) -> None:
    """``start_worker`` ends with a cold shutdown, which does not wait for the threads
    pool: the task still runs after it, so it still holds (and renews) its lock."""
    with start_worker(
        celery_lock_app, pool="threads", concurrency=2, perform_ping_check=False,
        shutdown_timeout=20, loglevel="WARNING",
    ):  # fmt: skip
        result = gate.task.delay()
        assert gate.started.wait(TIMEOUT)
    assert holder_task_id(lock_client, "gate") == result.id
    assert gate.released == []
    gate.open.set()
    wait_for(lambda: gate.released, TIMEOUT, "the run to release its lock")
    assert gate.released == [result.id]
    assert holder_task_id(lock_client, "gate") is None


# -- the pool matrix: real ``celery worker -P <pool>`` processes ---------------------------------

POOLS = ["prefork", "threads", "solo", "gevent", "eventlet"]
#: Pools whose tasks are greenlets: the heartbeat runs only when a task body yields.
GREEN = {"gevent", "eventlet"}


class PoolWorkers(WorkerPrograms):
    """``pool_app`` workers on the test Redis under one lock prefix and queue, and a twin
    app to send their tasks."""

    def __init__(self, url: str, prefix: str, log_dir: Path) -> None:
        super().__init__("apps.pool_app", make_app, url, prefix, log_dir, "pools")

    def start(self, pool: str, label: str, concurrency: int = 2) -> PoolWorker:
        # The shutdown messages go to stdout, which is a file here: unbuffered, so the test
        # sees them when they are written.
        env = {"PYTHONUNBUFFERED": "1"}
        return self.launch(
            label, [self.queue("pools")], pool=pool, concurrency=concurrency, env=env
        )

    def send(self, task: str, *args: Any) -> Any:
        return self.app.tasks[f"pool_app.{task}"].apply_async(args)

    def open_gate(self, key: str) -> None:
        self.redis.set(gate_key(self.prefix, key), 1, ex=RECORD_TTL)

    def lock_key(self, key: str) -> bytes:
        return lock_keys(self.prefix, f"pool:{key}").lock

    def holder(self, key: str) -> dict[str, str]:
        raw = flatten(self.redis.hgetall(self.lock_key(key)))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def server_ms(self) -> int:
        seconds, micros = self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def without_expiry(self) -> list[bytes]:
        """Keys under the lock prefix that would stay forever: none, the key layout record
        (core/layout.py) included."""
        keys = self.redis.scan_iter(match=self.prefix.replace("*", r"\*") + "*", count=1000)
        return [key for key in keys if self.redis.pttl(key) == -1]

    def wait_renewed_while_held(self, key: str, task_id: str, after_ms: int) -> None:
        """Until the heartbeat of run ``task_id`` has renewed its lock of ``key`` after
        ``after_ms`` (server time); fails at once if the lock changes hands or goes."""

        def renewed() -> bool:
            holder = self.holder(key)
            assert holder.get("task_id") == task_id, f"{task_id} no longer holds it: {holder}"
            return int(holder.get("renewed_ms", 0)) > after_ms

        wait_for(renewed, TIMEOUT, "a renewal of the running task's lock")


@pytest.fixture
def pool_workers(lock_redis_url: str, lock_prefix: str, tmp_path: Path) -> Iterator[PoolWorkers]:
    workers = PoolWorkers(lock_redis_url, lock_prefix, tmp_path)
    yield workers
    workers.close()


def wait_log(worker: PoolWorker, text: str) -> None:
    wait_for(lambda: text in worker.log_text(), TIMEOUT, f"{text!r} in the log of {worker.name}")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("pool", POOLS)
def test_runs_of_one_key_never_overlap_under_four_way_concurrency(
    pool: str, pool_workers: PoolWorkers
) -> None:
    # Four slots: four children, threads or greenlets; the solo pool runs one task per
    # worker, so four solo workers.
    if pool == "solo":
        workers = [pool_workers.start(pool, f"solo{i}", concurrency=1) for i in range(4)]
    else:
        workers = [pool_workers.start(pool, pool, concurrency=4)]
    pool_workers.wait_ready(*workers)
    results = [pool_workers.send("hold", "shared", 0.2) for _ in range(8)]
    tokens = [result.get(timeout=120) for result in results]
    runs = []
    for result, token in zip(results, tokens, strict=True):
        start = pool_workers.wait_record(event="start", task_id=result.id)
        end = pool_workers.wait_record(event="end", task_id=result.id)
        runs.append((start["time"], end["time"], token, (start["pid"], start["thread"])))
    runs.sort()
    for before, after in itertools.pairwise(runs):
        assert after[0] >= before[1], f"two runs overlapped: {before} and {after}"
        assert after[2] > before[2]  # fencing tokens grow with every holder
    assert len({slot for *_, slot in runs}) >= 2, "the runs never used two slots at once"
    assert pool_workers.without_expiry() == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "pool, yield_every",
    [(pool, 0.0) for pool in POOLS] + [(pool, 0.1) for pool in sorted(GREEN)],
)
def test_cpu_bound_body_keeps_its_lock_or_loses_it_loudly(
    pool: str, yield_every: float, pool_workers: PoolWorkers
) -> None:
    """A body computing for 2.5 leases. Only a greenlet that never yields starves the
    heartbeat: its lease runs out while it runs, and the worker says so (a WARNING from
    the heartbeat, an ERROR when the run ends); pausing 1 ms every 0.1 s keeps the lock."""
    worker = pool_workers.start(pool, pool)
    pool_workers.wait_ready(worker)
    result = pool_workers.send("spin", "cpu", 2.5 * LEASE, yield_every)
    result.get(timeout=60)
    end = pool_workers.wait_record(event="end", task_id=result.id)
    starves = pool in GREEN and not yield_every
    assert end["lost"] is starves
    if starves:
        # Found lost by the run's own release at the latest: lock_lost, never lock_released.
        assert pool_workers.wait_record(event="lost", task_id=result.id)
        wait_log(worker, "ran without its lock at the end")
        wait_log(worker, "lock_lease must be longer than its longest stretch without pausing")
    else:
        released = pool_workers.wait_record(event="released", task_id=result.id)
        assert released["released_token"] == end["token"]
        assert "ran without its lock" not in worker.log_text()
    assert not pool_workers.holder("cpu")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pool", POOLS)
def test_warm_shutdown_keeps_the_running_tasks_lock_until_it_ends(
    pool: str, pool_workers: PoolWorkers
) -> None:
    worker = pool_workers.start(pool, pool)
    pool_workers.wait_ready(worker)
    result = pool_workers.send("gated", "warm")
    started = pool_workers.wait_record(event="start", task_id=result.id)
    os.kill(worker.pid, signal.SIGTERM)
    wait_log(worker, "Warm shutdown")
    # Still held by the running task, and still renewed, a whole lease after the worker
    # began to stop (had nobody renewed it, it would be gone by then).
    begun = pool_workers.server_ms()
    pool_workers.wait_renewed_while_held("warm", result.id, begun + int(LEASE * 1000))
    assert worker.process.poll() is None
    pool_workers.open_gate("warm")
    assert worker.process.wait(TIMEOUT) == 0
    end = pool_workers.wait_record(event="end", task_id=result.id)
    released = pool_workers.wait_record(event="released", task_id=result.id)
    assert released["pid"] == started["pid"] and released["time"] >= end["time"]
    assert result.get(timeout=TIMEOUT) == started["token"]
    assert not pool_workers.holder("warm")
    assert pool_workers.without_expiry() == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pool", POOLS)
def test_cold_shutdown_frees_cut_off_runs_and_keeps_runs_it_cannot_cut_off(
    pool: str, pool_workers: PoolWorkers
) -> None:
    """SIGQUIT cuts the running task off (a child terminated, a greenlet killed, an
    exception in the solo pool's main thread): its own ``finally`` releases the lock at
    once. A thread cannot be cut off: the task runs on to its end, holding its lock."""
    worker = pool_workers.start(pool, pool)
    pool_workers.wait_ready(worker)
    result = pool_workers.send("gated", "cold")
    started = pool_workers.wait_record(event="start", task_id=result.id)
    os.kill(worker.pid, signal.SIGQUIT)
    # Celery's cold shutdown handler says this first (what it does next differs by pool).
    wait_log(worker, "Hitting Ctrl+C again will terminate all running tasks")
    if pool == "threads":
        begun = pool_workers.server_ms()
        pool_workers.wait_renewed_while_held("cold", result.id, begun + int(LEASE * 1000))
        pool_workers.open_gate("cold")
    released = pool_workers.wait_record(event="released", task_id=result.id)
    assert released["pid"] == started["pid"]  # by the run itself, not by the lease running out
    worker.process.wait(TIMEOUT)
    assert not pool_workers.holder("cold")
    assert pool_workers.without_expiry() == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pool", POOLS)
def test_sigkilled_worker_frees_the_lock_within_the_lease(
    pool: str, pool_workers: PoolWorkers
) -> None:
    worker = pool_workers.start(pool, pool)
    pool_workers.wait_ready(worker)
    result = pool_workers.send("gated", "killed")
    started = pool_workers.wait_record(event="start", task_id=result.id)
    assert pool_workers.holder("killed")["task_id"] == result.id
    worker.kill()  # the whole process group: nobody is left to release anything
    killed_at = time.monotonic()
    remaining = pool_workers.redis.pttl(pool_workers.lock_key("killed")) / 1000
    assert 0 < remaining <= LEASE  # the lease, not the one-hour lock_ttl
    client = LockClient.from_url(pool_workers.url, prefix=pool_workers.prefix)
    try:
        successor = client.lease("pool:killed", ttl=5)
        assert successor.acquire(wait=LEASE + 10)
        waited = time.monotonic() - killed_at
        assert successor.token > started["token"]
        successor.release()
    finally:
        client.close()
    assert waited < LEASE + 5  # the lease, plus room for a slow machine
    assert not pool_workers.records(event="released", task_id=result.id)


# -- until_start: a call let into the queue runs ---------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("pool", ["prefork", "gevent"])
def test_until_start_call_whose_queue_claim_went_waits_and_runs(
    pool: str, pool_workers: PoolWorkers
) -> None:
    """A call ``until_start`` let into the queue, whose queue claim is gone by the time it
    starts (run out, freed) and held by a later call, is not "replaced": that is
    ``debounce``'s rule. It waits for the running call (``lock_wait``) and runs after it."""
    worker = pool_workers.start(pool, pool, concurrency=4)
    pool_workers.wait_ready(worker)
    queued = pool_workers.app.tasks["pool_app.queued"]
    running = pool_workers.send("queued", "busy")
    pool_workers.wait_record(event="start", task_id=running.id)
    # Accepted (a new task id) while the key runs, in a queue no worker consumes yet.
    accepted = queued.apply_async(("busy",), queue=pool_workers.queue("late"))
    assert accepted.id != running.id
    assert queued.free_claim(("busy",), {}, task_id=accepted.id, attempt=0)
    later = queued.apply_async(("busy",), queue=pool_workers.queue("never"))
    assert later.id not in (running.id, accepted.id)  # holds the queue claim now
    late = pool_workers.launch("late", [pool_workers.queue("late")], pool=pool, concurrency=1)
    pool_workers.wait_ready(late)
    wait_for(
        lambda: accepted.ready() or pool_workers.holder("busy").get("waiting"),
        TIMEOUT,
        "the accepted call to start and wait for the lock",
    )
    pool_workers.open_gate("busy")
    token = accepted.get(timeout=60)
    assert isinstance(token, int), token  # it ran, and was not skipped
    assert token > running.get(timeout=TIMEOUT)
    first_end = pool_workers.wait_record(event="end", task_id=running.id)
    assert pool_workers.wait_record(event="start", task_id=accepted.id)["time"] >= first_end["time"]
    assert "replaced by queued task" not in late.log_text()


# -- hard time limit with acks_late: the message comes back after the lock is freed ----------


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "task", ["stuck", "stuck_release_delay"], ids=["no-delay", "release-delay"]
)
def test_hard_time_limit_requeues_the_message_only_once_the_killed_run_is_freed(
    pool_workers: PoolWorkers, task: str
) -> None:
    """``acks_late`` with ``acks_on_failure_or_timeout=False`` (and ``reject_on_worker_lost``):
    a run killed at its hard time limit is delivered again. The lock must be freed (after
    the kill) before the message is back in the queue: a copy that an idle worker takes at
    once would otherwise meet its own task id's hold and be dropped. Celery rejects through
    the worker's event loop, after the pool's timer callbacks, the release that follows the
    kill among them; so the copy finds the key free and runs. With ``lock_release_delay``
    the killed run, which did not end, leaves no release delay in its copy's way; the copy,
    which ends, does."""
    workers = [pool_workers.start("prefork", f"limit{i}", concurrency=1) for i in range(2)]
    pool_workers.wait_ready(*workers)
    result = pool_workers.send(task, "limit")
    first = pool_workers.wait_record(event="start", task_id=result.id, delivery=1)
    # The copy runs to its end (an ignored copy would leave no such record).
    end = pool_workers.wait_record(event="end", task_id=result.id, delivery=2)
    assert end["token"] > first["token"]

    # A fresh AsyncResult each time: one caches the first finished state it sees, here
    # maybe the FAILURE the time limit stored before the copy ran.
    def fresh() -> Any:
        return pool_workers.app.AsyncResult(result.id)

    wait_for(lambda: fresh().state == "SUCCESS", TIMEOUT, "the copy's result")
    assert fresh().result == end["token"]
    assert len(pool_workers.records(event="start", task_id=result.id)) == 2
    logs = "".join(worker.log_text() for worker in workers)
    assert "Hard time limit" in logs and "whose process ended" in logs
    holder = pool_workers.holder("limit")
    if task == "stuck_release_delay":
        assert holder.get("state") == "release_delay" and not holder.get("owner"), holder
    else:
        assert not holder
