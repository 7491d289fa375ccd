"""Configuration errors that name the fix: the closest known option or setting for a
misspelled one, and when a task's bad options are refused (the app finalized, or first use)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from celery import Celery

from celery_singleton_lock import ConfigurationError, SingletonTask
from celery_singleton_lock.celery.options import AppSettings


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
