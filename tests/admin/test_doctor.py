"""``locks doctor``: each check against a real redis-server configured to fail it (or, for
what a local server cannot be made to show, the check's pure function), a clean server
passing, the Celery app's facts, the worker's start-up WARNING, and both front ends end to
end with their exit codes."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_singleton_lock import LockClient, SingletonTask, admin
from celery_singleton_lock.admin import doctor
from celery_singleton_lock.admin.doctor import (
    ERROR,
    INFO,
    OK,
    WARNING,
    AppFacts,
    ServerFacts,
)
from celery_singleton_lock.celery.app_client import close_lock_client
from celery_singleton_lock.celery.doctor import app_facts
from celery_singleton_lock.celery.worker import warn_if_evicting
from celery_singleton_lock.cli import commands
from celery_singleton_lock.embedded import RedisServer
from celery_singleton_lock.kinds.lease import CLAIM_OWNER_PREFIX

TESTS = Path(__file__).parent.parent
CELERY = Path(sys.executable).with_name("celery")


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A redis-server of this test's own: the tests reconfigure it (CONFIG SET)."""
    with RedisServer() as started:
        yield started


@pytest.fixture
def conn(server: RedisServer) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(server.url)
    yield made
    made.close()


def make_clean(conn: redis.Redis) -> None:
    """What a deployment that passes every server check looks like."""
    conn.config_set("maxmemory", "0")
    conn.config_set("maxmemory-policy", "noeviction")
    conn.config_set("appendonly", "yes")


def make_evicting(conn: redis.Redis) -> None:
    """The configuration of the issue's measurement: 8 MB and volatile-lru."""
    conn.config_set("maxmemory", "8mb")
    conn.config_set("maxmemory-policy", "volatile-lru")


def finding(findings: list[doctor.Finding], check: str) -> doctor.Finding:
    return next(found for found in findings if found.check == check)


# -- eviction ----------------------------------------------------------------------------------


def test_eviction_volatile_lru_is_an_error(server: RedisServer, conn: redis.Redis) -> None:
    make_evicting(conn)
    facts = doctor.read_server(conn, server.url)
    assert (facts.maxmemory, facts.maxmemory_policy) == (8 * 1024 * 1024, "volatile-lru")
    found = doctor.check_eviction(facts)
    assert found.level == ERROR
    assert "volatile-lru" in found.found
    assert found.breaks and "evicts" in found.breaks
    assert found.fix and "noeviction" in found.fix


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl", "allkeys-random"])
def test_eviction_every_evicting_policy_is_an_error(
    server: RedisServer, conn: redis.Redis, policy: str
) -> None:
    conn.config_set("maxmemory", "64mb")
    conn.config_set("maxmemory-policy", policy)
    assert doctor.check_eviction(doctor.read_server(conn, server.url)).level == ERROR


def test_eviction_passes_without_maxmemory_or_with_noeviction(
    server: RedisServer, conn: redis.Redis
) -> None:
    conn.config_set("maxmemory-policy", "volatile-lru")  # no maxmemory: nothing evicts
    assert doctor.check_eviction(doctor.read_server(conn, server.url)).level == OK
    conn.config_set("maxmemory", "8mb")
    conn.config_set("maxmemory-policy", "noeviction")
    assert doctor.check_eviction(doctor.read_server(conn, server.url)).level == OK


def test_config_refused_makes_facts_unknown_not_an_error(
    server: RedisServer, conn: redis.Redis
) -> None:
    """A login that may not run CONFIG (managed Redis): unknown, and the doctor goes on."""
    make_evicting(conn)
    conn.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-config")
    limited = redis.Redis(port=server.port, username="app", password="pw")
    try:
        facts = doctor.read_server(limited, server.url)
    finally:
        limited.close()
    assert facts.maxmemory is None and facts.version is not None
    assert doctor.check_eviction(facts).level == INFO
    assert doctor.check_restarts(facts).level == INFO


# -- the worker's start-up warning -------------------------------------------------------------


def start_up_warnings(url: str, caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """What the worker's start-up check logs at WARNING and above for the Redis at ``url``."""
    client = LockClient.from_url(url)
    try:
        with caplog.at_level(logging.WARNING, logger="celery_singleton_lock.worker"):
            warn_if_evicting(client)
    finally:
        client.close()
    return [r for r in caplog.records if r.name == "celery_singleton_lock.worker"]


def test_worker_warns_once_at_start_on_an_evicting_redis(
    server: RedisServer, conn: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    make_evicting(conn)
    warnings = start_up_warnings(server.url, caplog)
    assert len(warnings) == 1
    assert "volatile-lru" in warnings[0].getMessage()
    assert "noeviction" in warnings[0].getMessage()


def test_worker_says_unknown_when_config_is_refused(
    server: RedisServer, conn: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    conn.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-config")
    [record] = start_up_warnings(f"redis://app:pw@127.0.0.1:{server.port}/0", caplog)
    assert "unknown" in record.getMessage()


def test_worker_is_quiet_on_a_redis_that_never_evicts(
    server: RedisServer, conn: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    make_clean(conn)
    assert not start_up_warnings(server.url, caplog)


def test_a_starting_worker_logs_the_eviction_warning(
    server: RedisServer,
    conn: redis.Redis,
    in_process_worker: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker step's start reads the policy once and warns once."""
    make_evicting(conn)
    app = Celery(f"csltest-{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.conf.update(broker_url=server.url, worker_hijack_root_logger=False)

    @app.task(base=SingletonTask, name="doctor.locked", shared=False)
    def locked() -> None:
        """Binding a SingletonTask installs the worker step."""

    try:
        with (
            caplog.at_level(logging.WARNING, logger="celery_singleton_lock.worker"),
            in_process_worker(app, pool="solo", concurrency=1),
        ):
            pass
    finally:
        close_lock_client(app)
        app.close()
    warnings = [
        r
        for r in caplog.records
        if r.name == "celery_singleton_lock.worker" and "volatile-lru" in r.getMessage()
    ]
    assert len(warnings) == 1


# -- restarts and failover ---------------------------------------------------------------------


def test_no_persistence_and_no_replica_is_a_warning(server: RedisServer, conn: redis.Redis) -> None:
    # The embedded server starts with appendonly no and save "".
    facts = doctor.read_server(conn, server.url)
    assert (facts.appendonly, facts.save, facts.connected_replicas) == ("no", "", 0)
    found = doctor.check_restarts(facts)
    assert found.level == WARNING
    assert found.fix is not None
    for what in ("appendonly", "replica", "singleton_lock_replicas"):
        assert what in found.fix


def test_persistence_passes_restarts(server: RedisServer, conn: redis.Redis) -> None:
    conn.config_set("appendonly", "yes")
    assert doctor.check_restarts(doctor.read_server(conn, server.url)).level == OK
    conn.config_set("appendonly", "no")
    conn.config_set("save", "900 1")
    assert doctor.check_restarts(doctor.read_server(conn, server.url)).level == OK


def attach_replica(master: RedisServer, replica: RedisServer) -> None:
    replica_conn = redis.Redis(port=replica.port)
    master_conn = redis.Redis(port=master.port)
    try:
        replica_conn.execute_command("REPLICAOF", "127.0.0.1", str(master.port))
        deadline = time.monotonic() + 10
        while master_conn.info("replication")["connected_slaves"] < 1:
            assert time.monotonic() < deadline, "the replica did not connect"
            time.sleep(0.05)  # waiting for another process: the replica's handshake
    finally:
        replica_conn.close()
        master_conn.close()


def test_replica_without_singleton_lock_replicas_is_a_warning(
    server: RedisServer, conn: redis.Redis
) -> None:
    with RedisServer() as replica:
        attach_replica(server, replica)
        facts = doctor.read_server(conn, server.url)
    assert facts.connected_replicas == 1
    found = doctor.check_failover(facts, AppFacts(from_app=True, replicas=0))
    assert found.level == WARNING and "singleton_lock_replicas=0" in found.found
    assert doctor.check_failover(facts, AppFacts(from_app=True, replicas=1)).level == OK
    # Without an app the setting is unknown: said, not guessed.
    assert doctor.check_failover(facts, AppFacts()).level == INFO
    # A replica keeps the locks across the loss of the server.
    assert doctor.check_restarts(facts).level == OK


def test_sentinel_without_replicas_setting_is_a_warning() -> None:
    facts = ServerFacts(version="7.0.15", mode="sentinel", connected_replicas=0)
    assert doctor.check_failover(facts, AppFacts(from_app=True, replicas=0)).level == WARNING


def test_no_replica_passes_failover() -> None:
    facts = ServerFacts(version="7.0.15", connected_replicas=0)
    assert doctor.check_failover(facts, AppFacts(from_app=True, replicas=0)).level == OK


# -- timeouts ----------------------------------------------------------------------------------


def test_socket_timeout_above_a_third_of_the_shortest_lease_is_an_error() -> None:
    facts = AppFacts(from_app=True, socket_timeout=5.0, leases={"a": 30.0, "b": 12.0})
    found = doctor.check_socket_timeout(facts)
    assert found.level == ERROR
    assert "b: 12 s" in found.found
    assert found.fix and "4 s" in found.fix
    assert (
        doctor.check_socket_timeout(
            AppFacts(from_app=True, socket_timeout=4.0, leases={"b": 12.0})
        ).level
        == OK
    )
    # No timeout at all waits for ever.
    infinite = AppFacts(from_app=True, socket_timeout=float("inf"), leases={"b": 12.0})
    assert doctor.check_socket_timeout(infinite).level == ERROR
    assert doctor.check_socket_timeout(AppFacts(from_app=True)).level == INFO


def test_visibility_timeout_below_an_acks_late_lease_is_a_warning() -> None:
    leases = {"tasks.late": 30.0, "tasks.early": 30.0}
    facts = AppFacts(
        from_app=True, leases=leases, acks_late=("tasks.late",), visibility_timeout=20.0
    )
    found = doctor.check_visibility(facts)
    assert found.level == WARNING
    assert "tasks.late" in found.found and "tasks.early" not in found.found
    assert found.breaks and "re-queued" in found.breaks and "done mark" in found.breaks
    # Without acks_late the message is acknowledged at start: no copy while it runs.
    facts = AppFacts(
        from_app=True, leases={"tasks.early": 30.0}, acks_late=(), visibility_timeout=20.0
    )
    assert doctor.check_visibility(facts).level == OK
    countdown = AppFacts(from_app=True, visibility_timeout=20.0, longest_countdown=60.0)
    assert doctor.check_visibility(countdown).level == WARNING
    assert doctor.check_visibility(AppFacts(from_app=True)).level == INFO


@pytest.fixture
def app(lock_redis_url: str, lock_prefix: str) -> Iterator[Celery]:
    """An app on the test Redis (broker and locks) whose settings fail both timeout checks."""
    app = Celery(f"csltest-{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.conf.update(
        broker_url=lock_redis_url,
        task_default_queue=f"{lock_prefix}queue",
        singleton_lock_prefix=lock_prefix,
        singleton_lock_client_kwargs={"socket_timeout": 5},
        broker_transport_options={"visibility_timeout": 10},
        worker_hijack_root_logger=False,
    )

    @app.task(base=SingletonTask, name="doctor.short", lock_lease=12, acks_late=True, shared=False)
    def short() -> None:
        """A task whose lease a 5 s socket timeout can outlast."""

    @app.task(base=SingletonTask, name="doctor.plain", shared=False)
    def plain() -> None:
        """A task with the default lease (30 s), acknowledged early."""

    yield app
    close_lock_client(app)
    app.close()


def test_app_facts_read_the_tasks_and_settings(app: Celery) -> None:
    facts = app_facts(app, timeout=0)
    # Only this app's two tasks: an in-process worker started earlier in this process (a
    # test of its own) makes its app Celery's default, whose tasks a later app may list too.
    mine = {name: facts.leases.get(name) for name in ("doctor.plain", "doctor.short")}
    assert mine == {"doctor.plain": 30.0, "doctor.short": 12.0}
    assert facts.acks_late == ("doctor.short",)
    assert facts.socket_timeout == 5.0
    assert facts.visibility_timeout == 10.0
    assert facts.replicas == 0
    assert facts.workers is None  # --timeout 0: not asked
    assert doctor.check_socket_timeout(facts).level == ERROR
    assert doctor.check_visibility(facts).level == WARNING


def test_the_default_socket_timeout_fits_the_default_lease(
    lock_redis_url: str, lock_prefix: str
) -> None:
    app = Celery(f"csltest-{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.conf.update(broker_url=lock_redis_url, singleton_lock_prefix=lock_prefix)

    @app.task(base=SingletonTask, name="doctor.default", shared=False)
    def default() -> None:
        """Default lease, default client."""

    try:
        facts = app_facts(app, timeout=0)
        assert facts.socket_timeout == 5.0  # the LockClient's default
        assert doctor.check_socket_timeout(facts).level == OK
        # kombu's default visibility timeout (an hour) is above any default lease.
        assert doctor.check_visibility(facts).level == OK
    finally:
        close_lock_client(app)
        app.close()


# -- version and Cluster -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "level"),
    [("4.0.14", ERROR), ("5.0.0", ERROR), ("6.0.20", ERROR), ("6.2.0", OK), ("7.2.4", OK)],
)
def test_version_against_what_the_scripts_need(version: str, level: str) -> None:
    assert doctor.check_version(ServerFacts(version=version)).level == level


def test_a_cluster_before_redis_7_has_no_sharded_pubsub() -> None:
    found = doctor.check_version(ServerFacts(version="6.2.14", mode="cluster"))
    assert found.level == INFO and "sharded" in found.found


def test_version_read_from_the_server(server: RedisServer, conn: redis.Redis) -> None:
    facts = doctor.read_server(conn, server.url)
    assert facts.version == conn.info("server")["redis_version"]
    assert doctor.check_version(facts).level == OK


@pytest.mark.parametrize(("state", "slots"), [("fail", 16384), ("ok", 16000), ("fail", 0)])
def test_a_cluster_not_ok_or_with_slots_uncovered_is_an_error(state: str, slots: int) -> None:
    facts = ServerFacts(
        version="7.0.15", mode="cluster", cluster_state=state, cluster_slots_ok=slots
    )
    assert doctor.check_cluster(facts).level == ERROR


def test_a_healthy_cluster_passes(cluster: Any) -> None:
    client = LockClient.from_url(cluster.url)
    try:
        facts = doctor.read_server(client.redis, cluster.url)
    finally:
        client.close()
    assert facts.mode == "cluster"
    assert (facts.cluster_state, facts.cluster_slots_ok) == ("ok", 16384)
    assert doctor.check_cluster(facts).level == OK


# -- what the package keeps in Redis -----------------------------------------------------------


def test_key_usage_by_kind(lock_client: LockClient, lock_prefix: str) -> None:
    held = lock_client.lease("report", ttl=30)
    assert held.acquire()
    claim = lock_client.lease("queued-call", ttl=30, owner=f"{CLAIM_OWNER_PREFIX}abc")
    assert claim.acquire()
    redis_client = lock_client.redis
    redis_client.set(f"{lock_prefix}{{report}}:done:some-task-id", "1", px=60_000)
    redis_client.set(f"{lock_prefix}{{report}}:waiting:some-task-id:0", "1", px=60_000)
    redis_client.set(f"{lock_prefix}unrelated", "1")  # not of the package's layout
    time.sleep(0.2)  # an age to measure, on the server's clock
    now_ms = admin.server_ms(lock_client)
    usage = doctor.read_key_usage(redis_client, lock_prefix, now_ms=now_ms)
    kinds = {kind.kind: kind for kind in usage.kinds}
    for held_kind in ("holds", "claims"):
        age = kinds[held_kind].oldest_age_s
        assert age is not None and 0.2 <= age < 30
    assert kinds["done marks"].oldest_age_s is None  # a mark records no time of its own
    assert kinds["holds"].keys == 1
    assert kinds["claims"].keys == 1
    assert kinds["done marks"].keys == 1
    assert kinds["wait marks"].keys == 1
    assert kinds["fencing counters"].keys == 2
    assert all(kind.bytes > 0 and kind.no_expiry == 0 for kind in usage.kinds)
    assert not usage.capped
    found = doctor.check_key_usage(usage)
    assert found.level == INFO and found.data is not None
    held.release()
    claim.release()


def test_key_usage_stops_at_max_keys_and_says_so(lock_client: LockClient, lock_prefix: str) -> None:
    for n in range(5):
        lock_client.redis.set(f"{lock_prefix}{{n{n}}}:done:x", "1", px=60_000)
    usage = doctor.read_key_usage(lock_client.redis, lock_prefix, max_keys=3)
    assert usage.capped and usage.scanned == 3
    assert "more exist" in doctor.check_key_usage(usage).found


# -- workers -----------------------------------------------------------------------------------


def test_a_node_name_used_twice_is_an_error() -> None:
    found = doctor.check_workers(
        AppFacts(from_app=True, workers=["celery@a", "celery@b", "celery@a"])
    )
    assert found.level == ERROR and "celery@a" in found.found and "celery@b" not in found.found
    assert (
        doctor.check_workers(AppFacts(from_app=True, workers=["celery@a", "celery@b"])).level == OK
    )


def test_remote_control_off_is_a_warning() -> None:
    assert (
        doctor.check_workers(AppFacts(from_app=True, workers=[], remote_control=False)).level
        == WARNING
    )
    assert (
        doctor.check_workers(AppFacts(from_app=True, workers=[], remote_control=True)).level == INFO
    )
    assert doctor.check_workers(AppFacts(from_app=True)).level == INFO


def test_workers_that_answer_are_listed(app: Celery, in_process_worker: Any) -> None:
    with in_process_worker(app, pool="solo", concurrency=1) as worker:
        facts = app_facts(app, timeout=2.0)
    assert facts.workers == [worker.hostname]
    assert doctor.check_workers(facts).level == OK


# -- the whole doctor, end to end --------------------------------------------------------------


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery_singleton_lock", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_clean_server_passes_every_check(server: RedisServer, conn: redis.Redis) -> None:
    make_clean(conn)
    result = run_module("--url", server.url, "doctor", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["ok"] is True
    assert document["counts"]["error"] == 0 and document["counts"]["warning"] == 0
    levels = {item["check"]: item["level"] for item in document["findings"]}
    assert levels["eviction"] == levels["restarts"] == levels["version"] == OK
    assert set(document["findings"][0]) == {"check", "level", "found", "breaks", "fix", "data"}


def test_an_evicting_server_fails_the_doctor(server: RedisServer, conn: redis.Redis) -> None:
    make_evicting(conn)
    result = run_module("--url", server.url, "doctor", "--json")
    assert result.returncode == 1, result.stderr
    document = json.loads(result.stdout)
    assert document["ok"] is False
    assert finding_level(document, "eviction") == ERROR
    assert finding_level(document, "restarts") == WARNING
    text = run_module("--url", server.url, "doctor")
    assert text.returncode == 1
    assert "ERROR   eviction: maxmemory 8388608 with maxmemory-policy volatile-lru" in text.stdout
    assert "fix: CONFIG SET maxmemory-policy noeviction" in text.stdout
    assert "a guarantee is broken" in text.stdout


def finding_level(document: dict[str, Any], check: str) -> str:
    return str(next(item["level"] for item in document["findings"] if item["check"] == check))


def test_warnings_alone_exit_zero(server: RedisServer) -> None:
    # The embedded server: no persistence, no replica (a warning), nothing else wrong.
    result = run_module("--url", server.url, "doctor")
    assert result.returncode == 0, result.stderr
    assert "WARNING restarts" in result.stdout


def test_an_unreachable_redis_exits_2() -> None:
    with RedisServer() as gone:
        url = gone.url
    result = run_module("--url", url, "doctor")
    assert result.returncode == 2
    assert "Error: Redis at" in result.stderr


def test_celery_locks_doctor_reads_the_app(app: Celery) -> None:
    obj = CLIContext(app=app, no_color=True, workdir=None)
    result = CliRunner().invoke(
        commands.locks, ["doctor", "--json", "--timeout", "0"], obj=obj, catch_exceptions=False
    )
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert finding_level(document, "socket-timeout") == ERROR
    assert finding_level(document, "visibility-timeout") == WARNING
    assert finding_level(document, "workers") == INFO  # --timeout 0: not asked


def test_two_workers_of_one_name_fail_celery_locks_doctor(
    server: RedisServer, conn: redis.Redis
) -> None:
    """Two real worker processes started with the same -n: both answer the ping under it."""
    make_clean(conn)
    env = dict(os.environ, PYTHONPATH=str(TESTS), CSL_TEST_BROKER_URL=server.url)
    worker = [str(CELERY), "-A", "apps.doctor_app", "worker", "-P", "solo", "-n", "dup@%h"]
    workers = [
        subprocess.Popen(
            [*worker, "--without-mingle", "--without-gossip", "-l", "WARNING"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    try:
        probe = Celery("probe", broker=server.url, set_as_current=False)
        deadline = time.monotonic() + 60
        while len(probe.control.ping(timeout=0.5)) < 2:
            assert time.monotonic() < deadline, "the workers did not start"
        probe.close()
        result = subprocess.run(
            [str(CELERY), "-A", "apps.doctor_app", "locks", "doctor", "--json", "--timeout", "2"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        for process in workers:
            process.terminate()
        for process in workers:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    assert result.returncode == 1, result.stderr
    document = json.loads(result.stdout)
    workers_found = next(item for item in document["findings"] if item["check"] == "workers")
    assert workers_found["level"] == ERROR
    assert "dup@" in workers_found["found"]
    assert [item["check"] for item in document["findings"] if item["level"] == ERROR] == ["workers"]


def test_without_an_app_the_app_checks_say_what_they_need() -> None:
    for check in (doctor.check_socket_timeout, doctor.check_visibility, doctor.check_workers):
        found = check(AppFacts())
        assert (found.level, found.found) == (INFO, doctor.NEEDS_APP)


def test_the_max_keys_default_is_the_readers() -> None:
    assert commands.DEFAULT_MAX_KEYS == doctor.DEFAULT_MAX_KEYS


def test_key_usage_report_in_text(lock_redis_url: str, lock_prefix: str) -> None:
    client = LockClient.from_url(lock_redis_url, prefix=lock_prefix)
    try:
        lease = client.lease("shown", ttl=30)
        assert lease.acquire()
        result = CliRunner().invoke(
            commands.main,
            ["--url", lock_redis_url, "--prefix", lock_prefix, "doctor"],
            catch_exceptions=False,
        )
        lease.release()
    finally:
        client.close()
    assert "KIND" in result.stdout and "holds" in result.stdout


def test_doctor_on_a_cluster(cluster: Any, client: LockClient) -> None:
    """Every primary is scanned and each key read on its own node."""
    held = [client.lease(f"spread-{n}", ttl=30) for n in range(6)]
    for lease in held:
        assert lease.acquire()
    prefix = client.prefix
    usage = doctor.read_key_usage(client.redis, prefix)
    kinds = {kind.kind: kind for kind in usage.kinds}
    assert kinds["holds"].keys == 6 and kinds["holds"].bytes > 0
    result = CliRunner().invoke(
        commands.main, ["--url", cluster.url, "--prefix", prefix, "doctor", "--json"]
    )
    for lease in held:
        lease.release()
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert finding_level(document, "cluster") == OK


def test_sentinel_without_singleton_lock_replicas_warns(sentinels: Any) -> None:
    """A real master, replica and sentinel: the failover check reads the app's setting."""

    def doctor_of(replicas: int) -> dict[str, Any]:
        app = Celery(f"csltest-{uuid.uuid4().hex[:8]}", set_as_current=False)
        app.conf.update(
            broker_url="memory://",
            singleton_lock_url=sentinels.url,
            singleton_lock_replicas=replicas,
        )
        obj = CLIContext(app=app, no_color=True, workdir=None)
        try:
            result = CliRunner().invoke(
                commands.locks, ["doctor", "--json", "--timeout", "0"], obj=obj
            )
        finally:
            close_lock_client(app)
            app.close()
        assert result.exit_code == 0, result.output  # warnings alone pass
        return dict(json.loads(result.stdout))

    unreplicated = doctor_of(0)
    assert finding_level(unreplicated, "failover") == WARNING
    # The replica also keeps the locks across the loss of the master.
    assert finding_level(unreplicated, "restarts") == OK
    assert finding_level(doctor_of(1), "failover") == OK


def test_one_evicting_primary_fails_the_cluster(cluster: Any, client: LockClient) -> None:
    """Every primary is read: the one that evicts is the one reported."""
    last = client.redis.get_primaries()[-1].redis_connection
    last.config_set("maxmemory", "64mb")
    last.config_set("maxmemory-policy", "volatile-lru")
    try:
        facts = doctor.read_server(client.redis, cluster.url)
    finally:
        last.config_set("maxmemory", "0")
        last.config_set("maxmemory-policy", "noeviction")
    assert facts.maxmemory_policy == "volatile-lru"
    assert doctor.check_eviction(facts).level == ERROR
    assert facts.cluster_state == "ok"
