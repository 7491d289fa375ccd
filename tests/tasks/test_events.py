"""Celery task events for lock activity, sent by a real in-process worker and read by a real
event receiver on the broker, as Flower reads them."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from apps.worker_app import make_app
from celery import Celery
from celery.contrib.testing.worker import start_worker
from support.lost_lock import task_losing_its_lock
from support.waiting import wait_for_subscriber
from support.workers import WorkerPrograms

from celery_singleton_lock import (
    SingletonTask,
    is_skipped,
    lock_acquired,
    lock_lost,
    lock_released,
    lock_skipped,
)
from celery_singleton_lock.celery.events import (
    EVENT_TYPES,
    EventSender,
    lock_fields,
    send_lock_event,
)
from celery_singleton_lock.celery.testing import TaskLocks
from celery_singleton_lock.embedded import RedisServer, free_port

WorkerFactory = Callable[..., AbstractContextManager[Any]]

TIMEOUT = 30
MARKER = "task-lock-test-marker"


class Events:
    """The events a real receiver got, in order, and a way to wait for them."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._queue: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.seen: list[dict[str, Any]] = []

    def put(self, event: dict[str, Any]) -> None:
        self._queue.put(event)

    def wait_for(self, type_: str, uuid: str | None = None) -> dict[str, Any]:
        """The first event of ``type_`` (about task ``uuid``) not yet returned."""
        deadline = time.monotonic() + TIMEOUT
        for event in self.seen:
            if event["type"] == type_ and uuid in (None, event.get("uuid")):
                self.seen.remove(event)
                return event
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no {type_} event for {uuid} (others: {self.seen})"
            try:
                event = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if event["type"] == type_ and uuid in (None, event.get("uuid")):
                return event
            self.seen.append(event)

    def lock_events_so_far(self) -> list[dict[str, Any]]:
        """Every lock event sent before now: publishes a marker of our own and collects what
        arrives before it (one broker keeps the order of what it was sent)."""
        with self.app.events.default_dispatcher(hostname="test") as dispatcher:
            dispatcher.send(MARKER, uuid="marker")
        self.wait_for(MARKER)
        return [event for event in self.seen if event["type"] in EVENT_TYPES]


@contextmanager
def receiving(app: Celery) -> Iterator[Events]:
    """Capture every event on ``app``'s broker while the block runs; the receiver listens
    before the block starts."""
    events = Events(app)
    ready = threading.Event()

    class Receiver(app.events.Receiver):  # type: ignore[misc,name-defined]
        def on_consume_ready(self, *args: Any, **kwargs: Any) -> None:
            ready.set()

    with app.connection_for_read() as connection:
        receiver = Receiver(connection, handlers={"*": events.put}, app=app)
        thread = threading.Thread(target=receiver.capture, kwargs={"limit": None}, daemon=True)
        thread.start()
        try:
            assert ready.wait(TIMEOUT), "the event receiver did not start"
            yield events
        finally:
            receiver.should_stop = True
            thread.join(TIMEOUT)


@pytest.fixture
def events_app(celery_lock_app: Celery) -> Celery:
    celery_lock_app.conf.worker_send_task_events = True
    return celery_lock_app


def test_acquired_and_released_events_carry_the_lock(
    events_app: Celery, in_process_worker: WorkerFactory
) -> None:
    @events_app.task(base=SingletonTask, shared=False, bind=True, lock_key="report:{day}")
    def report(self: Any, day: str) -> int:
        return int(self.lock.token)

    with receiving(events_app) as events, in_process_worker(events_app):
        result = report.delay("2026-11-23")
        token = result.get(timeout=TIMEOUT)
        acquired = events.wait_for("task-lock-acquired", result.id)
        released = events.wait_for("task-lock-released", result.id)
    for event in (acquired, released):
        assert event["lock_name"] == "report:2026-11-23"
        assert event["lock_holder"] == result.id
        assert event["lock_kind"] == "lease"
        assert event["lock_mode"] == "exclusive"
        assert event["lock_token"] == token
        assert event["hostname"]
    assert 0 <= acquired["lock_wait"] < 5
    assert acquired["timestamp"] <= released["timestamp"]


def test_wait_time_is_the_time_the_run_was_blocked(
    events_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    @events_app.task(base=SingletonTask, shared=False, lock_wait=TIMEOUT, lock_mode="read")
    def job() -> str:
        return "ran"

    with receiving(events_app) as events, in_process_worker(events_app):
        with task_locks.hold(job) as held:
            result = job.delay()
            wait_for_subscriber(job.lock_client, held.keys.channel)  # the run is blocked now
            blocked_since = time.monotonic()
        blocked_for = time.monotonic() - blocked_since
        task_locks.assert_ran(result)
        acquired = events.wait_for("task-lock-acquired", result.id)
    assert blocked_for <= acquired["lock_wait"] < TIMEOUT
    assert (acquired["lock_kind"], acquired["lock_mode"]) == ("read", "read")


def test_a_skipped_run_names_the_holder(
    events_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    started, finish = threading.Event(), threading.Event()

    @events_app.task(base=SingletonTask, shared=False, lock_key="ds:{n}")
    def rebuild(n: int) -> str:
        started.set()
        assert finish.wait(TIMEOUT)
        return "rebuilt"

    with receiving(events_app) as events, in_process_worker(events_app):
        first = rebuild.delay(1)
        assert started.wait(TIMEOUT)
        duplicate = rebuild.delay(1)
        task_locks.assert_skipped(duplicate)
        finish.set()
        task_locks.assert_ran(first)
        skipped = events.wait_for("task-lock-skipped", duplicate.id)
        assert not [e for e in events.lock_events_so_far() if e.get("uuid") == duplicate.id]
    assert skipped["lock_name"] == "ds:1"
    assert skipped["lock_holder"] == first.id
    assert (skipped["lock_kind"], skipped["lock_mode"]) == ("lease", "exclusive")
    assert skipped["lock_token"] is None
    assert 0 <= skipped["lock_wait"] < 5


def test_a_lost_lock_is_an_event(events_app: Celery, in_process_worker: WorkerFactory) -> None:
    with (
        task_losing_its_lock(events_app) as long_job,
        receiving(events_app) as events,
        in_process_worker(events_app),
    ):
        result = long_job.delay()
        assert result.get(timeout=TIMEOUT) == "stopped early"
        event = events.wait_for("task-lock-lost", result.id)
    assert event["lock_reason"] == "expired"
    assert event["lock_holder"] == result.id
    assert event["lock_name"] == long_job.lock_name()


def test_no_events_unless_the_worker_sends_task_events(
    celery_lock_app: Celery, in_process_worker: WorkerFactory
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False)
    def job() -> str:
        return "ran"

    with receiving(celery_lock_app) as events, in_process_worker(celery_lock_app):
        assert job.delay().get(timeout=TIMEOUT) == "ran"
        assert job.apply().get(timeout=TIMEOUT) == "ran"  # eager: never an event
        assert events.lock_events_so_far() == []


def test_enable_events_at_run_time_is_followed(celery_lock_app: Celery) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False)
    def job() -> str:
        return "ran"

    # A worker with heartbeats has an event dispatcher even without -E, as Flower finds it.
    worker = start_worker(
        celery_lock_app,
        pool="threads",
        perform_ping_check=False,
        shutdown_timeout=20,
        loglevel="WARNING",
        without_heartbeat=False,
    )
    with receiving(celery_lock_app) as events, worker as running:
        control = {"destination": [running.hostname], "reply": True, "timeout": TIMEOUT, "limit": 1}
        assert job.delay().get(timeout=TIMEOUT) == "ran"
        assert events.lock_events_so_far() == []
        # What Flower does when it starts: the enable_events remote control command.
        replies = celery_lock_app.control.enable_events(**control)
        assert replies and all("ok" in next(iter(r.values())) for r in replies), replies
        result = job.delay()
        assert result.get(timeout=TIMEOUT) == "ran"
        assert events.wait_for("task-lock-released", result.id)["lock_holder"] == result.id
        assert celery_lock_app.control.disable_events(**control)
        assert job.delay().get(timeout=TIMEOUT) == "ran"
        assert [e["uuid"] for e in events.lock_events_so_far()] == [result.id]


def test_a_task_can_opt_out_with_send_events(
    events_app: Celery, in_process_worker: WorkerFactory
) -> None:
    @events_app.task(base=SingletonTask, shared=False, send_events=False)
    def quiet() -> str:
        return "ran"

    with receiving(events_app) as events, in_process_worker(events_app):
        assert quiet.delay().get(timeout=TIMEOUT) == "ran"
        assert events.lock_events_so_far() == []


def test_an_unreachable_broker_costs_the_run_nothing(
    celery_lock_app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    dead = Celery("dead", broker=f"redis://127.0.0.1:{free_port()}/0", set_as_current=False)
    dead.conf.broker_connection_timeout = 0.5
    with caplog.at_level(logging.WARNING, "celery_singleton_lock.events"):
        assert not send_lock_event(dead, "w1", "task-lock-acquired", "t-dead", lock_name="x")
    assert "could not send task-lock-acquired for t-dead" in caplog.text

    # What the signal receivers do: queue and return at once; the sender thread gives up on
    # the dead broker and still sends what comes after.
    sender = EventSender()
    with receiving(celery_lock_app) as events:
        started = time.monotonic()
        sender.submit(dead, "w1", "task-lock-acquired", "t-dead", lock_name="x")
        sender.submit(celery_lock_app, "w1", "task-lock-acquired", "t-live", lock_name="y")
        assert time.monotonic() - started < 0.5
        assert events.wait_for("task-lock-acquired", "t-live")["lock_name"] == "y"
        assert sender.flush(TIMEOUT)


def test_signals_carry_the_wait_and_the_holder(celery_lock_app: Celery) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, lock_wait=0.2)
    def job() -> str:
        return "ran"

    seen: dict[str, Any] = {}

    def on_acquired(wait: float, **_: Any) -> None:
        seen["acquired"] = wait

    def on_skipped(wait: float, holder: str | None, **_: Any) -> None:
        seen["skipped"] = (wait, holder)

    lock_acquired.connect(on_acquired, sender=job, weak=False)
    lock_skipped.connect(on_skipped, sender=job, weak=False)
    try:
        with job.make_lock(owner_info={"task_name": job.name, "task_id": "holder-1"}):
            assert is_skipped(job.apply().get(timeout=TIMEOUT))
        assert job.apply().get(timeout=TIMEOUT) == "ran"
    finally:
        lock_acquired.disconnect(on_acquired, sender=job)
        lock_skipped.disconnect(on_skipped, sender=job)
    waited, holder = seen["skipped"]
    assert 0.2 <= waited < TIMEOUT  # it sat out its lock_wait first
    assert holder == "holder-1"
    assert 0 <= seen["acquired"] < 0.2


def test_a_run_whose_release_failed_is_forgotten(
    events_app: Celery, in_process_worker: WorkerFactory, restartable_redis: RedisServer
) -> None:
    events_app.conf.singleton_lock_url = restartable_redis.url  # locks apart from the broker

    @events_app.task(base=SingletonTask, shared=False)
    def job() -> str:
        restartable_redis.stop()  # the release at the end cannot reach Redis
        return "ran"

    with receiving(events_app) as events, in_process_worker(events_app):
        result = job.delay()
        assert result.get(timeout=TIMEOUT) == "ran"
        events.wait_for("task-lock-acquired", result.id)
        assert events.lock_events_so_far() == []  # no release to report
    # Forgotten: a later release or loss of that run would announce nothing (only the
    # task-event receivers asked: another module may have connected receivers of its own).
    for signal in (lock_released, lock_lost):
        checked = [entry for entry in signal.receivers if signal.is_checked(entry[1])]
        assert checked  # the task-event receivers are there to ask
        saved, signal.receivers[:] = list(signal.receivers), checked
        try:
            assert not signal.would_act(job, task_id=result.id)
        finally:
            signal.receivers[:] = saved


def test_a_prefork_worker_started_with_events_sends_them_from_its_child(
    lock_redis_url: str, lock_prefix: str, tmp_path: Path
) -> None:
    workers = WorkerPrograms(
        "apps.worker_app", make_app, lock_redis_url, lock_prefix, tmp_path, "events"
    )
    try:
        with receiving(workers.app) as events:
            worker = workers.launch("events", [workers.queue("events")], concurrency=1, args=["-E"])
            result = workers.app.tasks["worker_app.short_lease"].delay("events", 0)
            token = result.get(timeout=60)
            acquired = events.wait_for("task-lock-acquired", result.id)
            released = events.wait_for("task-lock-released", result.id)
    finally:
        workers.close()
    assert acquired["lock_name"] == released["lock_name"] == "job:events"
    assert acquired["lock_token"] == released["lock_token"] == token
    assert acquired["pid"] != worker.pid  # sent by the pool child that ran the task
    assert acquired["hostname"].startswith("events-")


@pytest.mark.parametrize(
    ("options", "kind", "mode"),
    [
        ({}, "lease", "exclusive"),
        ({"lock_mode": "upgradable"}, "upgradable", "upgradable"),
        ({"lock_range": ("lo", "hi"), "lock_key": "rows"}, "range", "write"),
        ({"lock_range": ("lo", "hi"), "lock_key": "rows", "lock_mode": "read"}, "range", "read"),
        ({"lock_keys": ["a:{lo}", "b:{hi}"]}, "multi", "exclusive"),
        ({"lock_limit": 3}, "semaphore", "exclusive"),
    ],
)
def test_lock_kind_and_mode_name_what_the_task_takes(
    celery_lock_app: Celery, options: dict[str, Any], kind: str, mode: str
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, **options)
    def job(lo: int, hi: int) -> None: ...

    fields = lock_fields(job, "name", "holder-1", None)
    assert (fields["lock_kind"], fields["lock_mode"]) == (kind, mode)
    assert fields["lock_holder"] == "holder-1"
    assert fields["lock_token"] is None
