"""``singleton_lock_tasks``: tasks that are not SingletonTasks (another package's, a
``shared_task`` you do not own), locked by name in real ``celery worker`` processes exactly as
a SingletonTask is — and a setting that can never work stops the worker at start."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apps.named_tasks_app import make_app
from celery import Celery, chord
from celery.contrib.testing.worker import start_worker
from support.workers import WorkerPrograms

from celery_singleton_lock import ConfigurationError, LockClient, SingletonTask, is_skipped
from celery_singleton_lock.celery.named_tasks import lock_named_tasks
from celery_singleton_lock.celery.signals import lock_acquired

TIMEOUT = 30.0


@pytest.fixture
def programs(lock_redis_url: str, lock_prefix: str, tmp_path: Path) -> Iterator[WorkerPrograms]:
    workers = WorkerPrograms(
        "apps.named_tasks_app", make_app, lock_redis_url, lock_prefix, tmp_path, "named"
    )
    yield workers
    workers.close()


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_task_named_in_the_setting_locks_as_a_singleton_task(
    programs: WorkerPrograms, lock_client: LockClient, pool: str
) -> None:
    queue = programs.queue("named")
    worker = programs.launch("named", [queue], pool=pool, concurrency=2)
    programs.wait_ready(worker)
    export = programs.app.tasks["named.export"]
    first = export.apply_async((7, 5), queue=queue)
    programs.wait_record(event="start", task_id=first.id)
    # The same customer while the first runs: skipped, the holder named.
    second = export.apply_async((7, 0), queue=queue)
    skipped = second.get(timeout=TIMEOUT)
    assert is_skipped(skipped) and skipped["holder_task_id"] == first.id
    # The lock is listed with its task, as any SingletonTask's.
    [info] = [info for info in lock_client.locks() if info.task_id == first.id]
    assert (info.name, info.task_name, info.state) == (
        'named.export:{"customer_id":7}',
        "named.export",
        "live",
    )
    assert info.lease_remaining_s is not None and info.lease_remaining_s <= 10  # lock_lease
    # Another customer runs beside it; a task the setting does not name holds nothing.
    assert export.apply_async((8, 0), queue=queue).get(timeout=TIMEOUT) == 8
    assert programs.app.tasks["named.unlocked"].apply_async(queue=queue).get(TIMEOUT) == "ran"
    assert first.get(timeout=TIMEOUT) == 7
    assert "singleton locks on" in worker.log_text()


def test_a_base_class_call_wrapper_runs_inside_the_lock(programs: WorkerPrograms) -> None:
    """A task's own ``__call__`` (a base class's wrapper: a transaction, a tenant context)
    runs in a worker: inside the lock for a task locked by name and for a SingletonTask
    subclass that lists SingletonTask first; around the lock (before it is taken) when the
    base class comes first, as Python's method order says."""
    queue = programs.queue("wrapped")
    worker = programs.launch("wrapped", [queue], pool="prefork", concurrency=1)
    programs.wait_ready(worker)
    cases = {"named.wrapped": True, "named.locked_wrapping": True, "named.wrapping_locked": False}
    for name, inside in cases.items():
        result = programs.app.tasks[name].apply_async((name,), queue=queue)
        assert result.get(timeout=TIMEOUT) == name
        wrappers = programs.records(event="wrapper", task_id=result.id)
        assert [entry["held"] for entry in wrappers] == [inside], name
        # The body still runs once, as the worker's request and holding its lock.
        [body] = programs.records(event="body", task_id=result.id)
        assert body["key"] == name and body["token"] is not None, name


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"named.nothing.*": {}}, "singleton_lock_tasks['named.nothing.*']: bad configuration: "
         "matches no registered task"),
        ({"named.export": {"lock_tll": 60}}, "singleton_lock_tasks['named.export'].lock_tll: "
         "bad configuration: unknown option; did you mean 'lock_ttl'?"),
        ({"named.export": {"lock_ttl": 10, "lock_lease": 20}}, "must not exceed lock_ttl"),
        ({"named.export": ["lock_ttl"]}, "must be a dict of lock_* options"),
        ({"named.export": {"ttl": 60}}, "'ttl' is not a lock_* option"),
        ({"celery.chord_unlock": {}}, "singleton_lock_tasks['celery.chord_unlock']: bad "
         "configuration: celery.chord_unlock's lock key cannot be built: celery.chord_unlock "
         "argument 'Result': defaults to AsyncResult (a type)"),
    ],
)  # fmt: skip
def test_a_setting_that_can_never_work_stops_the_worker_at_start(
    programs: WorkerPrograms, setting: dict[str, Any], message: str
) -> None:
    worker = programs.launch(
        "bad", [programs.queue("bad")], pool="solo", env={"CSL_NAMED_TASKS": json.dumps(setting)}
    )
    assert worker.process.wait(TIMEOUT) == 1
    assert message in worker.log_text()


@pytest.mark.parametrize(
    "setting",
    [
        {"*": {}},
        # Named exactly, with a key made of its arguments, chord_unlock is locked too.
        {"*": {}, "celery.chord_unlock": {"lock_key": ["group_id"], "lock_release_delay": 60}},
    ],
)
def test_a_chord_completes_when_a_glob_names_every_task(
    programs: WorkerPrograms, lock_client: LockClient, tmp_path: Path, setting: dict[str, Any]
) -> None:
    """A backend without native chords (the file system's) runs ``celery.chord_unlock`` until
    the header is done; a glob must not lock it, or its key fails every run and the chord
    never completes. The Redis backend joins chords itself, so it would not show this."""
    results = tmp_path / "results"
    results.mkdir()
    backend = f"file://{results}"
    programs.app.conf.result_backend = backend
    env = {"CSL_NAMED_TASKS": json.dumps(setting), "CSL_RESULT_BACKEND": backend}
    worker = programs.launch("chord", [programs.queue("named")], pool="threads", env=env)
    programs.wait_ready(worker)
    tasks = programs.app.tasks
    header = [tasks["named.export"].s(customer, 0) for customer in (1, 2)]
    result = chord(header)(tasks["named.total"].s())
    assert result.get(timeout=TIMEOUT) == 3
    if "celery.chord_unlock" in setting:
        # Its lock, in its release delay, is named by the chord's group id.
        names = [info.name for info in lock_client.locks("celery.chord_unlock:*")]
        assert names == [f'celery.chord_unlock:{{"group_id":"{result.parent.id}"}}']


def test_a_glob_leaves_celerys_own_tasks_plain(celery_lock_app: Celery) -> None:
    app = celery_lock_app

    @app.task(name="mine.report", shared=False)
    def report(day: int) -> int:
        return day

    app.conf.singleton_lock_tasks = {"*": {"lock_ttl": 60}}
    locked = lock_named_tasks(app)  # the tests' shared tasks too
    assert "mine.report" in locked and [name for name in locked if name.startswith("celery.")] == []
    built_in = [name for name in app.tasks if name.startswith("celery.")]
    assert {"celery.chord_unlock", "celery.backend_cleanup", "celery.accumulate"} <= set(built_in)
    assert [name for name in built_in if isinstance(app.tasks[name], SingletonTask)] == []
    assert isinstance(app.tasks["mine.report"], SingletonTask)


def test_a_built_in_task_named_exactly_is_locked(celery_lock_app: Celery) -> None:
    app = celery_lock_app
    app.conf.singleton_lock_tasks = {
        "celery.backend_cleanup": {},
        "celery.chord_unlock": {"lock_key": ["group_id"]},
    }
    assert lock_named_tasks(app) == ["celery.backend_cleanup", "celery.chord_unlock"]
    assert app.tasks["celery.backend_cleanup"].lock_name() == "celery.backend_cleanup:{}"
    unlock = app.tasks["celery.chord_unlock"]
    assert (
        unlock.lock_name(("g1", {"task": "named.total"})) == 'celery.chord_unlock:{"group_id":"g1"}'
    )


@pytest.mark.parametrize(
    ("key", "options", "message"),
    [
        ("celery.*", {}, "bad configuration: matches only Celery's built-in tasks, which a "
         "glob never converts; name one exactly to lock it"),
        ("celery.chord_unlock", {}, "celery.chord_unlock argument 'Result': defaults to "
         "AsyncResult (a type), which cannot make a lock key"),
        ("mine.sync", {}, "mine.sync argument 'clock': defaults to monotonic (a "
         "builtin_function_or_method), which cannot make a lock key"),
        ("mine.sync", {"lock_key": "sync:{clock}"}, "argument 'clock': defaults to monotonic"),
        ("mine.sync", {"lock_keys": ["sync:{clock}"]}, "argument 'clock': defaults to monotonic"),
        ("mine.sync", {"lock_key": ["customer"]}, "['customer'] are not arguments of the task"),
    ],
)  # fmt: skip
def test_a_key_that_can_never_be_built_is_refused(
    celery_lock_app: Celery, key: str, options: dict[str, Any], message: str
) -> None:
    app = celery_lock_app

    @app.task(name="mine.sync", shared=False)
    def sync(customer_id: int, clock: Any = time.monotonic) -> int:
        return customer_id

    app.conf.singleton_lock_tasks = {key: options}
    with pytest.raises(ConfigurationError) as info:
        lock_named_tasks(app)
    assert info.value.argument == f"singleton_lock_tasks[{key!r}]"
    assert message in str(info.value)
    built_in = [name for name in app.tasks if name.startswith("celery.")]
    for name in ["mine.sync", *built_in]:
        assert not isinstance(app.tasks[name], SingletonTask), name


def test_a_key_of_arguments_with_plain_defaults_is_accepted(celery_lock_app: Celery) -> None:
    app = celery_lock_app

    @app.task(name="mine.sync", shared=False)
    def sync(customer_id: int, clock: Any = time.monotonic, full: bool = False) -> int:
        return customer_id

    app.conf.singleton_lock_tasks = {"mine.*": {"lock_key": ["customer_id", "full"]}}
    assert lock_named_tasks(app) == ["mine.sync"]
    assert sync.lock_name((7,)) == 'mine.sync:{"customer_id":7,"full":false}'


def test_in_process_the_named_task_takes_its_lock_and_sends_the_signals(
    celery_lock_app: Celery,
) -> None:
    app = celery_lock_app
    started, finish = threading.Event(), threading.Event()

    @app.task(name="lib.sync", shared=False)
    def sync(customer_id: int) -> int:
        started.set()
        assert finish.wait(TIMEOUT)
        return customer_id

    app.conf.singleton_lock_tasks = {"lib.*": {"lock_key": ["customer_id"]}}
    acquired: list[str] = []

    def on_acquired(sender: Any = None, name: str = "", **_: Any) -> None:
        acquired.append(name)

    lock_acquired.connect(on_acquired, weak=False)
    try:
        # worker_init locks the named tasks (as `celery worker` does through this package).
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
            assert isinstance(app.tasks["lib.sync"], SingletonTask)
            first = sync.delay(1)
            assert started.wait(TIMEOUT)
            assert is_skipped(sync.delay(1).get(timeout=TIMEOUT))
            finish.set()
            assert first.get(timeout=TIMEOUT) == 1
    finally:
        lock_acquired.disconnect(on_acquired)
    assert acquired == ['lib.sync:{"customer_id":1}']
    assert lock_named_tasks(app) == []  # done once


def test_a_singleton_task_matched_by_a_pattern_keeps_its_own_options(
    celery_lock_app: Celery,
) -> None:
    app = celery_lock_app

    @app.task(base=SingletonTask, name="own.report", lock_ttl=120, shared=False)
    def report() -> None:
        return None

    @app.task(name="own.plain", shared=False)
    def plain() -> None:
        return None

    app.conf.singleton_lock_tasks = {"own.*": {"lock_ttl": 60}}
    assert lock_named_tasks(app) == ["own.plain"]
    assert app.tasks["own.report"].lock_ttl == 120 and app.tasks["own.plain"].lock_ttl == 60


def test_the_setting_is_checked_before_any_task_is_changed(celery_lock_app: Celery) -> None:
    celery_lock_app.conf.singleton_lock_tasks = "named.*"
    with pytest.raises(ConfigurationError) as info:
        lock_named_tasks(celery_lock_app)
    assert info.value.argument == "singleton_lock_tasks"


def test_a_task_two_keys_name_is_refused(celery_lock_app: Celery) -> None:
    @celery_lock_app.task(name="both.export", shared=False)
    def export() -> None:
        return None

    celery_lock_app.conf.singleton_lock_tasks = {
        "both.*": {"lock_ttl": 60},
        "both.export": {"lock_ttl": 120},
    }
    with pytest.raises(ConfigurationError) as info:
        lock_named_tasks(celery_lock_app)
    assert info.value.argument == "singleton_lock_tasks['both.export']"
    assert "named by 'both.*' too" in str(info.value)
