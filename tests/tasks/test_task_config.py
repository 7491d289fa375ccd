"""Configuration that can never work fails fast, in words that say what is wrong: the worker
stops at start, ``delay()``/``apply()`` raise before sending. Real Redis servers and real
Celery workers; Redis merely down at start is not a configuration error."""

from __future__ import annotations

import dataclasses
import json
import logging
import ssl
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import TestWorkController
from celery.worker import state
from support.redis_topologies import SENTINEL_MASTER, SentinelSet, TLSServer, running

from celery_singleton_lock import ConfigurationError, LockClient, SingletonTask, install
from celery_singleton_lock.celery.options import (
    APP_SETTINGS,
    KIND_OPTIONS,
    MODE_KINDS,
    OPTIONS,
    TASK_OPTIONS,
    AppSettings,
    TaskLockOptions,
)
from celery_singleton_lock.celery.task import lock_client_for
from celery_singleton_lock.cli import commands
from celery_singleton_lock.embedded import RedisServer, free_port
from celery_singleton_lock.kinds.registry import family_named

WorkerFactory = Callable[..., AbstractContextManager[Any]]

TIMEOUT = 30


def make_app(**conf: Any) -> Celery:
    app = Celery(f"csltest-{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.conf.update(
        {
            "broker_url": "memory://",
            "broker_connection_retry_on_startup": True,
            "worker_hijack_root_logger": False,
            "task_default_queue": f"csltest-{uuid.uuid4().hex[:8]}",
            **conf,
        }
    )
    return app


def base_url(lock_redis_url: str) -> str:
    """The test server's URL without its database."""
    scheme, _, rest = lock_redis_url.partition("://")
    return f"{scheme}://{rest.partition('/')[0]}"


def start_and_wait_for_end(app: Celery) -> TestWorkController:
    """Start a real worker for ``app`` in a thread and wait for it to end by itself; fail
    (stopping it) if it is still running after TIMEOUT."""
    install(app)
    worker = TestWorkController(
        app=app,
        pool="solo",
        concurrency=1,
        loglevel="WARNING",
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
    )
    thread = threading.Thread(target=worker.start, daemon=True)
    thread.start()
    thread.join(TIMEOUT)
    if thread.is_alive():
        state.should_terminate = 0
        thread.join(TIMEOUT)
        state.should_terminate = None
        pytest.fail("the worker kept running with a configuration that can never work")
    return worker


#: Settings that can never work, and the setting the error must name. ``{url}`` is the test
#: server's URL, ``{host}`` its host:port.
BAD_SETTINGS = [
    pytest.param({}, "singleton_lock_url", id="no-url-with-a-memory-broker"),
    pytest.param({"singleton_lock_url": "http://{host}/0"}, "singleton_lock_url", id="http"),
    pytest.param({"singleton_lock_url": "{host}"}, "singleton_lock_url", id="no-scheme"),
    pytest.param({"singleton_lock_url": "redis://{host}/abc"}, "singleton_lock_url", id="db-abc"),
    pytest.param({"singleton_lock_url": "redis://{host}/99"}, "singleton_lock_url", id="db-99"),
    pytest.param(
        {"singleton_lock_url": "{url}", "singleton_lock_tll": 3},
        "singleton_lock_tll",
        id="misspelled-setting",
    ),
    pytest.param(
        {"singleton_lock_url": "{url}", "singleton_lock_lease": 30, "singleton_lock_ttl": 20},
        "singleton_lock_lease",
        id="lease-above-ttl",
    ),
    pytest.param(
        {"singleton_lock_url": "{url}", "singleton_lock_conflict": "never"},
        "singleton_lock_conflict",
        id="bad-setting-value",
    ),
    pytest.param(
        {"singleton_lock_url": "{url}", "singleton_lock_client_kwargs": {"bogus": 1}},
        "singleton_lock_client_kwargs",
        id="unknown-client-keyword",
    ),
    pytest.param(
        {"singleton_lock_url": "{url}", "singleton_lock_client_kwargs": {"decode_responses": True}},
        "singleton_lock_client_kwargs",
        id="decoding-client",
    ),
    pytest.param(
        {"singleton_lock_url": "{url}", "singleton_lock_replicas": -1},
        "singleton_lock_replicas",
        id="negative-replicas",
    ),
    pytest.param(
        {"singleton_lock_url": "{url}", "singleton_lock_replica_timeout": 0},
        "singleton_lock_replica_timeout",
        id="zero-replica-timeout",
    ),
]


@pytest.mark.parametrize(("bad_conf", "setting"), BAD_SETTINGS)
def test_worker_stops_at_start_on_configuration_that_can_never_work(
    bad_conf: dict[str, Any],
    setting: str,
    lock_redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    host = base_url(lock_redis_url).partition("://")[2]
    conf = {
        key: value.format(url=lock_redis_url, host=host) if isinstance(value, str) else value
        for key, value in bad_conf.items()
    }
    app = make_app(**conf)

    @app.task(base=SingletonTask, shared=False)
    def job() -> str:
        return "ran"

    with caplog.at_level(logging.WARNING):
        worker = start_and_wait_for_end(app)
    assert worker.exitcode == 1
    errors = [r.getMessage() for r in caplog.records if "Unrecoverable error" in r.getMessage()]
    assert errors, caplog.text
    assert "configuration" in errors[0] and setting in errors[0], errors[0]
    assert "not reachable" not in caplog.text


def test_task_options_that_contradict_the_settings_stop_the_worker(
    lock_redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(singleton_lock_url=lock_redis_url, singleton_lock_ttl=20)

    @app.task(base=SingletonTask, shared=False, name="cfg.long_lease", lock_lease=30)
    def job() -> str:
        return "ran"

    with caplog.at_level(logging.WARNING):
        worker = start_and_wait_for_end(app)
    assert worker.exitcode == 1
    assert "cfg.long_lease.lock_lease" in caplog.text and "singleton_lock_ttl" in caplog.text


def test_a_range_over_missing_arguments_stops_the_worker(
    lock_redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(singleton_lock_url=lock_redis_url)

    @app.task(
        base=SingletonTask, shared=False, name="cfg.range", lock_key="res", lock_range=("lo", "x")
    )
    def job(lo: int, hi: int) -> None: ...

    with pytest.raises(ConfigurationError) as info:
        job.delay(1, 2)
    assert info.value.argument == "cfg.range.lock_range"
    with caplog.at_level(logging.WARNING):
        worker = start_and_wait_for_end(app)
    assert worker.exitcode == 1 and "cfg.range.lock_range" in caplog.text


def test_worker_starts_when_redis_is_merely_down(
    in_process_worker: WorkerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(
        singleton_lock_url=f"redis://127.0.0.1:{free_port()}/0", result_backend="cache+memory://"
    )

    @app.task(base=SingletonTask, shared=False, lock_backend_down="run")
    def job() -> str:
        return "ran"

    with caplog.at_level(logging.WARNING), in_process_worker(app, pool="solo", concurrency=1):
        assert job.delay().get(timeout=TIMEOUT) == "ran"
    assert "Redis not reachable at start" in caplog.text


def test_delay_and_apply_raise_before_sending(lock_redis_url: str, lock_prefix: str) -> None:
    queue = f"{lock_prefix}queue"
    app = make_app(
        broker_url=lock_redis_url,
        task_default_queue=queue,
        singleton_lock_url=base_url(lock_redis_url).replace("redis://", "http://"),
    )

    @app.task(base=SingletonTask, shared=False)
    def job() -> str:
        return "ran"

    for call in (job.delay, job.apply_async, job.apply):
        with pytest.raises(ConfigurationError) as info:
            call()
        assert info.value.argument == "singleton_lock_url"
        assert "configuration" in str(info.value) and "redis://" in str(info.value)
    broker = redis.Redis.from_url(lock_redis_url)
    try:
        assert broker.llen(queue) == 0  # nothing was queued that could never run
    finally:
        broker.close()


def test_the_check_at_delay_makes_no_redis_call(restartable_redis: RedisServer) -> None:
    app = make_app(singleton_lock_url=restartable_redis.url)

    @app.task(base=SingletonTask, shared=False)
    def job(n: int) -> None: ...

    locks = redis.Redis.from_url(restartable_redis.url)
    try:

        def commands() -> int:
            return int(locks.info("stats")["total_commands_processed"])

        before = commands()
        for n in range(3):
            job.delay(n)
        # Only our own INFO calls reached the lock Redis.
        assert commands() - before == 1
    finally:
        locks.close()


def test_a_database_the_server_lacks_fails_runs_as_configuration(lock_redis_url: str) -> None:
    app = make_app(singleton_lock_url=f"{base_url(lock_redis_url)}/99")

    @app.task(base=SingletonTask, shared=False, lock_backend_down="run")
    def job() -> str:
        return "ran"  # must not run unlocked: retrying cannot fix the URL

    result = job.apply()
    assert isinstance(result.result, ConfigurationError), result.result
    assert "configuration" in str(result.result) and "database" in str(result.result)
    # The error names the setting to fix, not the client's argument.
    assert result.result.argument == "singleton_lock_url"


def test_default_lease_adapts_to_a_short_ttl(
    celery_lock_app: Celery, in_process_worker: WorkerFactory
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False, bind=True, lock_ttl=20)
    def job(self: Any) -> list[float]:
        assert self.lock is not None and self.lock.held
        return [self.lock.ttl, self.lock.max_hold]

    with in_process_worker(celery_lock_app):
        assert job.delay().get(timeout=TIMEOUT) == pytest.approx([20 / 3, 20])
    celery_lock_app.conf.singleton_lock_ttl = 12

    @celery_lock_app.task(base=SingletonTask, shared=False, name="cfg.app_ttl")
    def app_ttl() -> None: ...

    assert app_ttl.lock_options.lease == pytest.approx(4)
    assert app_ttl.lock_options.max_hold == 12


def test_explicit_lease_above_ttl_raises_where_the_task_is_declared() -> None:
    with pytest.raises(ConfigurationError) as info:

        class Contradiction(SingletonTask):
            name = "cfg.contradiction"
            lock_ttl = 20
            lock_lease = 30

    assert info.value.argument == "cfg.contradiction.lock_lease"
    assert "configuration" in str(info.value) and "lock_ttl" in str(info.value)

    class ShortTtl(SingletonTask):
        lock_ttl = 20

    with pytest.raises(ConfigurationError) as inherited:

        class LongLease(ShortTtl):
            name = "cfg.inherited"
            lock_lease = 30

    assert inherited.value.argument == "cfg.inherited.lock_lease"


def test_misspelled_settings_in_django_namespace_are_named(lock_redis_url: str) -> None:
    settings = SimpleNamespace(
        CELERY_BROKER_URL="memory://",
        CELERY_SINGLETON_LOCK_URL=lock_redis_url,
        CELERY_SINGLETON_LOCK_TLL=20,
    )
    app = Celery(f"csltest-{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.config_from_object(settings, namespace="CELERY")

    @app.task(base=SingletonTask, shared=False)
    def job() -> None: ...

    with pytest.raises(ConfigurationError) as info:
        job.delay()
    assert info.value.argument == "CELERY_SINGLETON_LOCK_TLL"
    assert "singleton_lock_ttl" in str(info.value)  # the known names are listed


def test_django_namespace_settings_reach_the_locks(
    lock_redis_url: str, lock_prefix: str, lock_client: LockClient
) -> None:
    settings = SimpleNamespace(
        CELERY_BROKER_URL="memory://",
        CELERY_SINGLETON_LOCK_URL=lock_redis_url,
        CELERY_SINGLETON_LOCK_PREFIX=lock_prefix,
        CELERY_SINGLETON_LOCK_TTL=120,
    )
    app = Celery(f"csltest-{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.config_from_object(settings, namespace="CELERY")

    @app.task(base=SingletonTask, shared=False, bind=True)
    def job(self: Any) -> str:
        assert self.lock is not None and self.lock.held
        return str(self.lock.name)

    try:
        assert job.apply().get() == job.lock_name()
        assert job.lock_options.max_hold == 120
        client = lock_client_for(app)
        assert client.prefix == lock_prefix
        assert client.url == lock_client.url
    finally:
        lock_client_for(app).close()


@pytest.fixture(scope="module")
def tls() -> Iterator[TLSServer]:
    with running(TLSServer()) as server:
        yield server


def test_a_tls_broker_lends_its_ssl_options_to_the_locks(tls: TLSServer, lock_prefix: str) -> None:
    app = make_app(
        broker_url=f"redis://127.0.0.1:{tls.port}/0",
        broker_use_ssl={"ssl_ca_certs": str(tls.cert), "ssl_cert_reqs": ssl.CERT_REQUIRED},
        singleton_lock_prefix=lock_prefix,
    )

    @app.task(base=SingletonTask, shared=False, bind=True)
    def job(self: Any) -> bool:
        return bool(self.lock is not None and self.lock.held)

    try:
        assert job.apply().get() is True
        assert lock_client_for(app).url == f"rediss://127.0.0.1:{tls.port}/0"
    finally:
        lock_client_for(app).close()
    # broker_use_ssl=True turns TLS on; the certificate comes from the lock client's kwargs.
    app = make_app(
        broker_url=f"redis://127.0.0.1:{tls.port}/0",
        broker_use_ssl=True,
        singleton_lock_prefix=lock_prefix,
        singleton_lock_client_kwargs={"ssl_ca_certs": str(tls.cert)},
    )
    try:
        assert lock_client_for(app).ping()
    finally:
        lock_client_for(app).close()


def test_client_kwargs_setting_reaches_the_redis_client(tls: TLSServer, lock_prefix: str) -> None:
    app = make_app(
        singleton_lock_url=tls.url,
        singleton_lock_prefix=lock_prefix,
        singleton_lock_client_kwargs={"ssl_ca_certs": str(tls.cert)},
    )

    @app.task(base=SingletonTask, shared=False, bind=True)
    def job(self: Any) -> bool:
        return bool(self.lock is not None and self.lock.held)

    try:
        assert job.apply().get() is True
    finally:
        lock_client_for(app).close()
    with pytest.raises(ConfigurationError) as info:
        AppSettings.from_conf(
            make_app(singleton_lock_url=tls.url, singleton_lock_client_kwargs="ssl=1").conf
        )
    assert info.value.argument == "singleton_lock_client_kwargs"


def test_a_sentinel_broker_lends_master_name_and_sentinel_kwargs(
    sentinels: SentinelSet, lock_prefix: str
) -> None:
    # Kombu's spelling: sentinels in the URL, the master in the transport options.
    app = make_app(
        broker_url=f"sentinel://127.0.0.1:{sentinels.sentinel.port};sentinel://127.0.0.1:1",
        broker_transport_options={
            "master_name": SENTINEL_MASTER,
            "sentinel_kwargs": {"socket_timeout": 4.5},
        },
        singleton_lock_prefix=lock_prefix,
    )

    @app.task(base=SingletonTask, shared=False, bind=True, lock_key="sentinel-job")
    def job(self: Any) -> bool:
        return bool(self.lock is not None and self.lock.held)

    client = lock_client_for(app)
    master = redis.Redis(port=sentinels.master.port)
    try:
        pool: Any = client.redis.connection_pool
        assert pool.service_name == SENTINEL_MASTER
        for sentinel in pool.sentinel_manager.sentinels:
            assert sentinel.connection_pool.connection_kwargs["socket_timeout"] == 4.5
        held = client.lease("sentinel-job", ttl=5, heartbeat=False)
        assert held.acquire()
        # The lock is on the master the sentinel names, and the task's runs meet it there.
        assert master.exists(client.connection.keys("sentinel-job").lock)
        skipped = job.apply().get()
        assert skipped["lock"] == "sentinel-job" and skipped["holder_task_id"] is None
        held.release()
        assert job.apply().get() is True
    finally:
        master.close()
        client.close()


def test_the_admin_command_connects_as_the_tasks_do(tls: TLSServer, lock_prefix: str) -> None:
    """``celery locks`` reads the TLS options the locks take from the broker and
    ``singleton_lock_client_kwargs``, so it reaches a Redis the tasks reach."""
    from celery.bin.base import CLIContext
    from click.testing import CliRunner

    app = make_app(
        broker_url=f"redis://127.0.0.1:{tls.port}/0",
        broker_use_ssl=True,
        singleton_lock_prefix=lock_prefix,
        singleton_lock_client_kwargs={"ssl_ca_certs": str(tls.cert)},
    )
    client = lock_client_for(app)
    try:
        lease = client.lease("admin-over-tls", ttl=30)
        assert lease.acquire()
        obj = CLIContext(app=app, no_color=True, workdir=None)
        listed = CliRunner().invoke(
            commands.locks, ["--timeout", "0", "list", "--json"], obj=obj, catch_exceptions=False
        )
        assert listed.exit_code == 0, listed.output
        assert [item["name"] for item in json.loads(listed.stdout)] == ["admin-over-tls"]
        lease.release()
    finally:
        client.close()


def test_each_task_option_is_declared_once_and_the_rest_follows_it() -> None:
    names = [option.name for option in OPTIONS]
    assert len(set(names)) == len(names) and all(name.startswith("lock_") for name in names)
    assert list(TASK_OPTIONS) == names
    assert [TASK_OPTIONS[option.name] for option in OPTIONS] == [
        (option.default, option.check) for option in OPTIONS
    ]
    # The typed attributes of SingletonTask and fields of TaskLockOptions are spelled out for
    # the type checker: they must be exactly the declared options, in their order.
    assert list(SingletonTask.__annotations__) == names
    assert all(getattr(SingletonTask, name) is None for name in names)
    assert [field.name for field in dataclasses.fields(TaskLockOptions)] == [
        option.field for option in OPTIONS
    ]
    settings = [f"singleton_{option.name}" for option in OPTIONS if not option.per_task_only]
    assert [name for name in APP_SETTINGS if name in settings] == settings
    for option in OPTIONS:
        assert f"``{option.name}``: {option.doc}" in (SingletonTask.__doc__ or "")


def test_every_lock_family_a_task_can_select_is_in_the_kind_registry() -> None:
    # An option that selects a family, and each lock_mode, name a family of the registry
    # that takes that mode: make_lock makes its handles through it.
    for option, _, kind in KIND_OPTIONS:
        assert kind is not None and family_named(kind).handles is not None, option
    for mode, kind in MODE_KINDS.items():
        assert mode in family_named(kind).modes, (mode, kind)
    with pytest.raises(ConfigurationError) as info:
        family_named("fair-queue")  # no such family
    assert info.value.argument == "family"
