"""The task option ``lock_limit``: at most N runs at once per key, on a real in-process
worker (threads pool) and through ``apply()``; the option combinations it refuses; permits
in ``celery locks``."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result
from support.waiting import wait_for

from celery_singleton_lock import (
    ConfigurationError,
    LockClient,
    LockExpired,
    LockTimeout,
    Permit,
    SingletonTask,
)
from celery_singleton_lock.celery.testing import TaskLocks
from celery_singleton_lock.cli import commands

TIMEOUT = 30

WorkerFactory = Callable[..., AbstractContextManager[Any]]


class Runs:
    """Counts the runs inside the body per key: now, and the most seen at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside: Counter[str] = Counter()
        self.most: Counter[str] = Counter()
        self.entered: Counter[str] = Counter()

    def enter(self, key: str) -> None:
        with self.lock:
            self.inside[key] += 1
            self.entered[key] += 1
            self.most[key] = max(self.most[key], self.inside[key])

    def leave(self, key: str) -> None:
        with self.lock:
            self.inside[key] -= 1

    def now(self, key: str) -> int:
        with self.lock:
            return self.inside[key]


@pytest.mark.timeout(120)
def test_lock_limit_two_never_runs_three_at_once_per_key_and_other_keys_run_beside(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    runs = Runs()
    gate = threading.Event()

    @celery_lock_app.task(
        base=SingletonTask, shared=False, bind=True, lock_limit=2, lock_key="export:{customer}"
    )
    def export(self: Any, customer: str) -> int:
        assert isinstance(self.lock, Permit) and self.lock.held
        runs.enter(customer)
        try:
            assert gate.wait(TIMEOUT)
        finally:
            runs.leave(customer)
        return int(self.lock.token)

    with in_process_worker(celery_lock_app, pool="threads", concurrency=4):
        first = [export.delay("acme"), export.delay("acme")]
        wait_for(lambda: runs.now("acme") == 2, TIMEOUT, "two acme exports to run")
        # At the limit: a third run for the key is skipped (lock_conflict "skip")...
        task_locks.assert_skipped(export.delay("acme"))
        # ...while another key runs beside the two.
        other = export.delay("globex")
        wait_for(lambda: runs.now("globex") == 1, TIMEOUT, "the globex export to run")
        assert runs.now("acme") == 2
        gate.set()
        tokens = [task_locks.assert_ran(result) for result in (*first, other)]
        assert len(set(tokens)) == 3
        # Free again afterwards.
        assert task_locks.assert_ran(export.delay("acme")) > max(tokens)
    assert runs.most["acme"] == 2 and runs.entered["acme"] == 3
    assert not task_locks.is_held(export, "acme")


@pytest.mark.timeout(120)
def test_waiting_runs_take_turns_at_most_two_at_once(
    celery_lock_app: Celery, in_process_worker: WorkerFactory, task_locks: TaskLocks
) -> None:
    runs = Runs()
    release = threading.Semaphore(0)  # the test lets one body finish per release()

    @celery_lock_app.task(
        base=SingletonTask,
        shared=False,
        lock_limit=2,
        lock_key="sync:{account}",
        lock_wait=TIMEOUT,
    )
    def sync(account: str) -> str:
        runs.enter(account)
        try:
            assert release.acquire(timeout=TIMEOUT)
        finally:
            runs.leave(account)
        return account

    with in_process_worker(celery_lock_app, pool="threads", concurrency=4):
        results = [sync.delay("a") for _ in range(4)]
        wait_for(lambda: runs.now("a") == 2, TIMEOUT, "two runs of account a")
        # Four pool slots, two runs in and two waiting for a permit (woken by a release).
        for done in range(1, 5):
            release.release()
            wait_for(lambda done=done: runs.entered["a"] == min(4, done + 2), TIMEOUT, "a turn")
        for result in results:
            assert task_locks.assert_ran(result) == "a"
    assert runs.most["a"] == 2 and runs.entered["a"] == 4


def test_task_locks_hold_takes_every_permit(celery_lock_app: Celery, task_locks: TaskLocks) -> None:
    @celery_lock_app.task(
        base=SingletonTask,
        shared=False,
        name="limit.held",
        lock_limit=3,
        lock_key="k:{n}",
        lock_conflict="raise",
    )
    def job(n: int) -> int:
        return n

    assert not task_locks.is_held(job, 1)
    with task_locks.hold(job, 1) as handle:
        assert isinstance(handle, Permit) and handle.limit == 3
        assert task_locks.is_held(job, 1)
        with pytest.raises(LockTimeout):
            job.apply(args=[1]).get(timeout=TIMEOUT)
        assert task_locks.assert_ran(job.apply(args=[2])) == 2
        infos = [info for info in job.lock_client.locks() if info.kind == "semaphore"]
        assert len(infos) == 3 and {info.limit for info in infos} == {3}
    assert task_locks.assert_ran(job.apply(args=[1])) == 1


@pytest.mark.parametrize(
    ("options", "argument", "names"),
    [
        ({"lock_mode": "read"}, "limit.bad.lock_mode", "lock_limit"),
        ({"lock_range": ("start", "end")}, "limit.bad.lock_limit", "lock_range"),
        ({"lock_keys": ["a:{start}"]}, "limit.bad.lock_limit", "lock_keys"),
        ({"lock_on_enqueue": True}, "limit.bad.lock_on_enqueue", "lock_limit"),
        ({"lock_on_enqueue": "until_start"}, "limit.bad.lock_on_enqueue", "lock_limit"),
    ],
)
def test_lock_limit_refuses_options_it_cannot_work_with(
    celery_lock_app: Celery, options: dict[str, Any], argument: str, names: str
) -> None:
    @celery_lock_app.task(
        base=SingletonTask, shared=False, name="limit.bad", lock_limit=2, **options
    )
    def job(start: int, end: int) -> None: ...

    with pytest.raises(ConfigurationError) as info:
        job.lock_naming  # noqa: B018
    assert info.value.argument == argument
    assert names in str(info.value)


@pytest.mark.parametrize("limit", [0, -2, 1.5, True, "2"])
def test_a_bad_lock_limit_is_refused_where_the_task_is_declared(limit: Any) -> None:
    with pytest.raises(ConfigurationError) as info:

        class Bad(SingletonTask):  # type: ignore[misc]
            name = "limit.declared"
            lock_limit = limit

    assert info.value.argument == "limit.declared.lock_limit"


def test_lock_limit_has_no_app_setting(celery_lock_app: Celery) -> None:
    celery_lock_app.conf.singleton_lock_limit = 2

    @celery_lock_app.task(base=SingletonTask, shared=False, name="limit.setting")
    def job() -> None: ...

    with pytest.raises(ConfigurationError) as info:
        job.check_lock_configuration()
    assert "singleton_lock_limit" in str(info.value)


def test_celery_locks_lists_shows_and_clears_permits(
    celery_lock_app: Celery, lock_client: LockClient
) -> None:
    sem = lock_client.semaphore("cli-sem", 3)
    alive, dead = sem.permit(), sem.permit(owner_info={"task_id": "t-dead"})
    assert alive.acquire() and dead.acquire()
    # A holder whose heartbeat stopped long ago (its process froze or died).
    stale_at = lock_client.server_ms() - 60_000
    lock_client.redis.hset(dead.keys.holder(dead.owner or ""), "renewed_ms", stale_at)

    def run(*args: str) -> Result:
        obj = CLIContext(app=celery_lock_app, no_color=True, workdir=None)
        return CliRunner().invoke(commands.locks, list(args), obj=obj, catch_exceptions=False)

    listed = run("list")
    assert listed.exit_code == 0
    rows = [line for line in listed.stdout.splitlines() if line.startswith("cli-sem")]
    assert len(rows) == 2 and all("semaphore/3" in row for row in rows)
    shown = json.loads(run("show", "cli-sem", "--json").stdout)
    assert sorted((item["kind"], item["limit"], item["state"]) for item in shown) == [
        ("semaphore", 3, "live"),
        ("semaphore", 3, "stale"),
    ]
    cleared = run("clear", "--stale", "--yes")
    assert cleared.exit_code == 0, cleared.output
    assert [info.token for info in lock_client.locks()] == [alive.token]
    assert alive.held
    with pytest.raises(LockExpired):
        dead.release()
    alive.release()
