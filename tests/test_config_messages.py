"""Configuration errors that name the fix: the closest known option or setting for a
misspelled one, and when a task's bad options are refused (the app finalized, or first use)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock import ConfigurationError, LockBackendError, SingletonTask
from celery_singleton_lock.celery.options import AppSettings
from celery_singleton_lock.embedded import free_port

WorkerFactory = Callable[..., AbstractContextManager[Any]]


def test_a_misspelled_task_option_is_refused_at_finalize_with_the_closest_name() -> None:
    app = Celery("messages", set_as_current=False)

    @app.task(base=SingletonTask, lock_tll=60, shared=False)
    def report() -> None:
        return None

    # @app.task registers a promise: the class (and its check) is made at finalize.
    with pytest.raises(ConfigurationError) as info:
        app.finalize()
    assert info.value.argument.endswith("report.lock_tll")
    assert "did you mean 'lock_ttl'?" in str(info.value)


def test_a_lease_above_the_ttl_is_refused_at_first_use() -> None:
    app = Celery("messages", set_as_current=False)

    @app.task(base=SingletonTask, lock_ttl=10, lock_lease=20, shared=False)
    def report() -> None:
        return None

    with pytest.raises(ConfigurationError) as info:
        report.delay  # noqa: B018 - the first use creates the task
    assert info.value.argument.endswith("report.lock_lease")
    assert "must not exceed lock_ttl" in str(info.value)


def test_an_option_nothing_is_close_to_gets_no_suggestion() -> None:
    with pytest.raises(ConfigurationError) as info:

        class Report(SingletonTask):
            lock_frobnicate = 3

    assert "did you mean" not in str(info.value)
    assert "known options: lock_backend_down" in str(info.value)


@pytest.mark.parametrize(
    ("config", "namespace", "suggested"),
    [
        ({"singleton_lock_tll": 3}, None, "'singleton_lock_ttl'"),
        ({"singleton_lock_leese": 3}, None, "'singleton_lock_lease'"),
        ({"CELERY_SINGLETON_LOCK_TLL": 3}, "CELERY", "'CELERY_SINGLETON_LOCK_TTL'"),
        ({"CELERY_SINGLETON_LOCK_PERFIX": "x:"}, "CELERY", "'CELERY_SINGLETON_LOCK_PREFIX'"),
    ],
)
def test_a_misspelled_setting_suggests_the_closest_spelled_as_it_was(
    config: dict[str, object], namespace: str | None, suggested: str, lock_redis_url: str
) -> None:
    app = Celery("messages", set_as_current=False)
    url_key = "CELERY_SINGLETON_LOCK_URL" if namespace else "singleton_lock_url"
    settings = SimpleNamespace(**{url_key: lock_redis_url, **config})
    app.config_from_object(settings, namespace=namespace)
    with pytest.raises(ConfigurationError) as info:
        AppSettings.for_app(app)
    assert info.value.argument == next(iter(config))
    assert f"did you mean {suggested}?" in str(info.value)


def test_a_run_the_lock_redis_refused_names_the_fixes(
    in_process_worker: WorkerFactory, lock_redis_url: str, lock_prefix: str
) -> None:
    app = Celery(f"messages-{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.conf.update(
        broker_url=lock_redis_url,
        result_backend=lock_redis_url,
        task_default_queue=f"{lock_prefix}queue",
        singleton_lock_url=f"redis://127.0.0.1:{free_port()}/0",  # nothing listens
        worker_hijack_root_logger=False,
    )

    @app.task(base=SingletonTask, shared=False)
    def job() -> str:
        return "ran"

    with in_process_worker(app, pool="solo", concurrency=1):
        result = job.delay()
        with pytest.raises(LockBackendError) as info:
            result.get(timeout=30)
    message = str(info.value)
    assert "127.0.0.1" in message  # the server, as before
    assert f"{job.name} did not run" in message
    assert "autoretry_for=(LockBackendError,)" in message
    assert 'lock_backend_down="run"' in message
