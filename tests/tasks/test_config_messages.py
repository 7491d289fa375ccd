"""Configuration errors that name the fix: the closest known option or setting for a
misspelled one, and when a task's bad options are refused (a worker starting, or first use)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock import (
    ConfigurationError,
    LockBackendError,
    LockClient,
    LockExpired,
    LockLost,
    SingletonTask,
)
from celery_singleton_lock.celery.options import AppSettings
from celery_singleton_lock.embedded import free_port

WorkerFactory = Callable[..., AbstractContextManager[Any]]


def test_a_misspelled_task_option_is_refused_at_first_use_with_the_closest_name() -> None:
    app = Celery("messages", set_as_current=False)

    @app.task(base=SingletonTask, lock_tll=60, shared=False)
    def report() -> None:
        return None

    # @app.task registers a promise: the class is made at finalize, which keeps the error
    # for the first use (a worker's start, delay, apply) rather than raising through Celery.
    app.finalize()
    with pytest.raises(ConfigurationError) as info:
        report.delay()
    assert info.value.argument.endswith("report.lock_tll")
    assert "did you mean 'lock_ttl'?" in str(info.value)
    with pytest.raises(ConfigurationError, match="did you mean 'lock_ttl'"):
        report.apply()


def test_a_lease_above_the_ttl_is_refused_at_first_use() -> None:
    app = Celery("messages", set_as_current=False)

    @app.task(base=SingletonTask, lock_ttl=10, lock_lease=20, shared=False)
    def report() -> None:
        return None

    with pytest.raises(ConfigurationError) as info:
        report.delay()
    assert info.value.argument.endswith("report.lock_lease")
    assert "must not exceed lock_ttl" in str(info.value)


WORKER_APP = """
from celery import Celery
from celery_singleton_lock import SingletonTask

app = Celery("bad_app", broker={url!r})
app.conf.singleton_lock_url = {url!r}
app.conf.update({settings!r})


@app.task(base=SingletonTask, **{options!r})
def report():
    return "ran"
"""


@pytest.mark.parametrize(
    ("settings", "options", "good_words"),
    [
        ({}, {"lock_tll": 5}, "bad_app.report.lock_tll: unknown option; did you mean 'lock_ttl'?"),
        (
            {},
            {"lock_ttl": 5, "lock_lease": 10},
            "lock_lease: bad configuration: lock_lease (10.0 s) must not exceed",
        ),
        ({"singleton_lock_tll": 5}, {}, "did you mean 'singleton_lock_ttl'?"),
    ],
    ids=["misspelled-option", "lease-above-ttl", "misspelled-setting"],
)
def test_a_celery_worker_refuses_a_bad_option_or_setting_in_one_line(
    lock_redis_url: str,
    tmp_path: Path,
    settings: dict[str, Any],
    options: dict[str, Any],
    good_words: str,
) -> None:
    (tmp_path / "bad_app.py").write_text(
        WORKER_APP.format(url=lock_redis_url, settings=settings, options=options)
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    command = [sys.executable, "-m", "celery", "-A", "bad_app", "worker", "-P", "solo", "-l"]
    command += ["INFO", "--without-heartbeat", "--without-mingle", "--without-gossip"]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    errors = [line for line in output.splitlines() if "Unrecoverable error:" in line]
    assert len(errors) == 1 and good_words in errors[0], output
    assert "Traceback" not in output and "finalize" not in output, output


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


def wait_gone(client: LockClient, key: bytes) -> None:
    deadline = time.monotonic() + 30
    while client.redis.exists(key):
        assert time.monotonic() < deadline, "the lease never ran out"
        time.sleep(0.05)


def test_a_lease_past_its_max_hold_says_so_not_that_it_expired(lock_client: LockClient) -> None:
    capped = lock_client.lease("capped", ttl=1, max_hold=2)  # renewed, but not past 2 s
    assert capped.acquire()
    wait_gone(lock_client, capped.keys.lock)
    with pytest.raises(LockExpired) as info:
        capped.release()
    assert info.value.reason == "max_hold"
    assert "ran out at its max_hold (2 s)" in str(info.value) and "raise max_hold" in str(
        info.value
    )

    stalled = lock_client.lease("stalled", ttl=1, heartbeat=False)  # no max_hold: expired
    assert stalled.acquire()
    wait_gone(lock_client, stalled.keys.lock)
    with pytest.raises(LockExpired) as info:
        stalled.release()
    assert info.value.reason == "expired" and "nobody holds it" in str(info.value)


def test_check_reports_a_lease_past_its_max_hold_as_the_heartbeat_does(
    lock_client: LockClient,
) -> None:
    # With max_hold not a whole number of renewals the heartbeat hears "max_hold reached",
    # stops renewing and never finds the lease gone: check() is the first to see it.
    capped = lock_client.lease("checked-cap", ttl=1, max_hold=1.5)
    assert capped.acquire()
    wait_gone(lock_client, capped.keys.lock)
    with pytest.raises(LockExpired) as info:
        capped.check()
    assert info.value.reason == "max_hold", str(info.value)
    assert "ran out at its max_hold (1.5 s)" in str(info.value)
    assert capped.lost
    with pytest.raises(LockExpired) as released:
        capped.release()
    assert released.value.reason == "max_hold"


def test_a_run_past_lock_ttl_is_reported_as_lock_ttl_reached(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    lock_client: LockClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    @celery_lock_app.task(
        base=SingletonTask,
        bind=True,
        shared=False,
        lock_key="long-report",
        lock_ttl=2,
        lock_lease=1,
    )
    def long_report(self: Any) -> dict[str, str]:
        wait_gone(lock_client, lock_client.connection.keys("long-report").lock)
        # The run's own look at its lock says what the heartbeat or the release would.
        try:
            self.lock.check()
        except LockLost as exc:
            return {"reason": str(exc.reason), "message": str(exc)}
        return {"reason": "", "message": "check() found it held"}

    long_report.lock_key = "long-report"
    with (
        caplog.at_level(logging.INFO, logger="celery_singleton_lock"),
        in_process_worker(celery_lock_app, pool="solo", concurrency=1),
    ):
        checked = long_report.delay().get(timeout=30)
    assert checked["reason"] == "max_hold", checked
    assert "ran out at its lock_ttl (2 s)" in checked["message"], checked
    assert "raise lock_ttl" in checked["message"], checked
    assert "ran past lock_ttl (2 s)" in caplog.text
    assert "lock_ttl reached" in caplog.text and "raise lock_ttl" in caplog.text
    assert "nobody holds it" not in caplog.text
    # Every line of the package speaks the task's options: the cap is lock_ttl and the
    # lease lock_lease; a task user never set a max_hold or a ttl.
    ours = [r for r in caplog.records if r.name.startswith("celery_singleton_lock")]
    lost = [r.getMessage() for r in ours if "lost (" in r.getMessage()]
    assert lost and all("lost (lock_ttl)" in line for line in lost), lost
    spoken = "\n".join(r.getMessage() for r in ours)
    assert "max_hold" not in spoken and " ttl" not in spoken, spoken
