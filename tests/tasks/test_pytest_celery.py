"""This package's pytest fixtures next to Celery's own (``celery.contrib.pytest``, which
pytest-celery loads), with the in-process app and worker: the recipe in docs/tasks.md."""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path
from typing import Any

import celery.contrib.pytest
import pytest
import pytest_celery.plugin
from celery import Celery
from celery.contrib.testing.worker import start_worker

import celery_singleton_lock.celery.pytest_plugin
from celery_singleton_lock import ConfigurationError, LockBackendError, LockClient, SingletonTask
from celery_singleton_lock.celery.testing import TaskLocks

pytest_plugins = ["pytester"]

TIMEOUT = 30
#: A port bound for as long as this module is loaded and never listened on: connections to it
#: are refused, and no server started meanwhile (another test's, on a parallel worker) can
#: take it, as it could a port that was merely found free.
_REFUSING = socket.socket()
_REFUSING.bind(("127.0.0.1", 0))
#: A Redis broker nobody answers on: a lock written there would fail with LockBackendError.
DEAD_BROKER = f"redis://127.0.0.1:{_REFUSING.getsockname()[1]}/0"


@pytest.fixture(scope="session")
def celery_config(singleton_lock_config: dict[str, str]) -> dict[str, Any]:
    return {"broker_url": "memory://", "result_backend": "cache+memory://", **singleton_lock_config}


def fixture_names(module: Any) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        # pytest >= 8.4 marks fixture definitions with the first, older ones with the second.
        if hasattr(value, "_fixture_function_marker") or hasattr(value, "_pytestfixturefunction")
    }


def test_both_plugins_load_with_no_fixture_clash(pytestconfig: pytest.Config) -> None:
    plugins = pytestconfig.pluginmanager
    assert plugins.has_plugin("celery")  # pytest-celery's entry point
    assert plugins.has_plugin("celery_singleton_lock")
    ours = fixture_names(celery_singleton_lock.celery.pytest_plugin)
    assert {"lock_redis_url", "task_locks", "singleton_lock_config", "singleton_lock_app"} <= ours
    celerys = fixture_names(celery.contrib.pytest) | fixture_names(pytest_celery.plugin)
    assert {"celery_app", "celery_config", "celery_worker"} <= celerys
    assert ours.isdisjoint(celerys)


def test_celery_config_puts_the_locks_on_the_test_redis(
    celery_app: Celery, lock_redis_url: str, task_locks: TaskLocks
) -> None:
    assert celery_app.conf.singleton_lock_url == lock_redis_url
    assert celery_app.conf.singleton_lock_prefix.startswith("csltest:")

    started, finish = threading.Event(), threading.Event()

    @celery_app.task(base=SingletonTask, shared=False)
    def report(day: str) -> str:
        started.set()
        assert finish.wait(TIMEOUT)
        return day

    # celery_worker is pytest-celery's Docker worker: start Celery's in-process one instead.
    with start_worker(celery_app, pool="threads", concurrency=2, perform_ping_check=False):
        first = report.delay("2026-11-23")
        assert started.wait(TIMEOUT)
        assert task_locks.is_held(report, "2026-11-23")
        task_locks.assert_skipped(report.delay("2026-11-23"))
        finish.set()
        assert task_locks.assert_ran(first) == "2026-11-23"
        assert task_locks.assert_ran(report.delay("2026-11-23")) == "2026-11-23"


def test_singleton_lock_app_has_the_tests_own_prefix(
    singleton_lock_app: Celery, lock_client: LockClient, lock_prefix: str, task_locks: TaskLocks
) -> None:
    assert singleton_lock_app.conf.singleton_lock_prefix == lock_prefix

    @singleton_lock_app.task(base=SingletonTask, shared=False, lock_key="job:{n}")
    def job(n: int) -> int:
        return n

    with task_locks.hold(job, 1):
        assert [info.name for info in lock_client.locks()] == ["job:1"]
        task_locks.assert_skipped(job.apply(args=[1]))
    assert lock_client.locks() == []


@pytest.mark.celery(broker_url=DEAD_BROKER, singleton_lock_url=None)
def test_singleton_lock_app_keeps_locks_off_the_broker(
    singleton_lock_app: Celery, lock_redis_url: str, task_locks: TaskLocks
) -> None:
    assert singleton_lock_app.conf.singleton_lock_url == lock_redis_url

    @singleton_lock_app.task(base=SingletonTask, shared=False)
    def job() -> str:
        return "ran"

    with task_locks.hold(job):  # on the dead broker this would raise LockBackendError
        task_locks.assert_skipped(job.apply())
    assert task_locks.assert_ran(job.apply()) == "ran"


def test_task_locks_refuses_to_lock_in_a_broker_redis(task_locks: TaskLocks) -> None:
    app = Celery("users_app", broker=DEAD_BROKER, set_as_current=False)

    @app.task(base=SingletonTask, shared=False)
    def job() -> None: ...

    for use in (lambda: task_locks.hold(job).__enter__(), lambda: task_locks.is_held(job)):
        with pytest.raises(ConfigurationError) as info:
            use()  # raised before any Redis call: a call would raise LockBackendError
        assert info.value.argument == "singleton_lock_url"
        assert "127.0.0.1" in str(info.value)

    app.conf.singleton_lock_url = DEAD_BROKER  # named on purpose: task_locks goes there
    with pytest.raises(LockBackendError, match="127.0.0.1"):
        task_locks.is_held(job)


DOCS = Path(__file__).resolve().parent.parent.parent / "docs" / "tasks.md"


def documented_recipe() -> tuple[str, str]:
    """The conftest.py and test module of the pytest-celery recipe in docs/tasks.md."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
    recipe = next(block for block in blocks if block.startswith("# conftest.py"))
    conftest, tests = recipe.split("# test_tasks.py")
    return conftest, tests


# Added to the recipe's conftest: singleton_lock_app's lock client was open during the test
# and is closed after it (the first fixture is torn down last, the second before the app).
CLIENT_CLOSED_CHECK = """

@pytest.fixture(autouse=True)
def client_closed_after_the_test(request):
    yield
    app = request.node.funcargs["singleton_lock_app"]
    assert request.node.had_lock_client
    assert "_singleton_lock_client" not in vars(app)

@pytest.fixture(autouse=True)
def client_open_during_the_test(request, singleton_lock_app):
    yield
    request.node.had_lock_client = "_singleton_lock_client" in vars(singleton_lock_app)
"""


def test_the_documented_recipe_passes(
    pytester: pytest.Pytester, lock_redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", lock_redis_url)  # the inner session shares our server
    conftest, tests = documented_recipe()
    pytester.makeconftest(conftest + CLIENT_CLOSED_CHECK)
    pytester.makepyfile(test_recipe=tests)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=1)
