"""Both front ends of the lock commands: ``python -m celery_singleton_lock`` and
``celery -A app locks`` (in process with click's runner, and as a real ``celery`` program)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from celery import Celery
from celery.bin.base import CLIContext
from celery.contrib.testing.worker import start_worker
from click.testing import CliRunner, Result

from celery_singleton_lock import LockClient, admin
from celery_singleton_lock.cli import commands, output
from celery_singleton_lock.core.heartbeat import heartbeat
from celery_singleton_lock.embedded import RedisServer

TESTS = Path(__file__).parent.parent
CELERY = Path(sys.executable).with_name("celery")


class TerminalRunner(CliRunner):
    """Click's runner as a person at a terminal uses the commands: stdin and stdout are
    terminals, so they prompt and color."""

    @contextlib.contextmanager
    def isolation(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        with super().isolation(*args, **kwargs) as streams:
            sys.stdin.isatty = lambda: True  # type: ignore[method-assign]
            sys.stdout.isatty = lambda: True  # type: ignore[method-assign]
            yield streams


def run_plain(
    url: str | None, prefix: str, *args: str, terminal: bool = False, **kwargs: Any
) -> Result:
    """``python -m celery_singleton_lock [--url URL] --prefix PREFIX ARGS`` (at a terminal:
    ``terminal``)"""
    options = ["--prefix", prefix] + (["--url", url] if url else [])
    runner = TerminalRunner() if terminal else CliRunner()
    return runner.invoke(commands.main, [*options, *args], catch_exceptions=False, **kwargs)


def run_celery(app: Celery, *args: str, **kwargs: Any) -> Result:
    """``celery -A app locks ARGS``, in process."""
    obj = CLIContext(app=app, no_color=True, workdir=None)
    return CliRunner().invoke(commands.locks, list(args), obj=obj, catch_exceptions=False, **kwargs)


def hold(client: LockClient, name: str, **options: Any) -> Any:
    lease = client.lease(name, ttl=30, **options)
    assert lease.acquire()
    return lease


def make_stale(client: LockClient, lease: Any) -> None:
    """What a holder whose heartbeat stopped long ago looks like."""
    client.redis.hset(
        lease.keys.lock, mapping={"heartbeat": 1, "renewed_ms": admin.server_ms(client) - 60_000}
    )


def names_in(result: Result) -> list[str]:
    return [item["name"] for item in json.loads(result.stdout)]


@pytest.fixture
def app(lock_redis_url: str, lock_prefix: str) -> Iterator[Celery]:
    """An app on the test Redis (broker, result backend, locks) with its own queue."""
    app = Celery(f"csltest-{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.conf.update(
        broker_url=lock_redis_url,
        result_backend=lock_redis_url,
        task_default_queue=f"{lock_prefix}queue",
        singleton_lock_prefix=lock_prefix,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    yield app
    app.close()


# -- python -m celery_singleton_lock ---------------------------------------------------------


def test_plain_list_json_table_and_exit_codes(
    lock_client: LockClient, lock_redis_url: str, lock_prefix: str
) -> None:
    empty = run_plain(lock_redis_url, lock_prefix, "list", "--json")
    assert (empty.exit_code, json.loads(empty.stdout)) == (1, [])
    hold(client=lock_client, name="report", owner_info={"task_id": "t1", "task_name": "tasks.r"})
    hold(lock_client, "other")
    result = run_plain(lock_redis_url, lock_prefix, "list", "--json")
    assert result.exit_code == 0 and names_in(result) == ["other", "report"]
    table = run_plain(lock_redis_url, lock_prefix, "list", "--pattern", "rep*")
    assert table.exit_code == 0
    header, row = table.stdout.splitlines()
    assert header.split() == list(output.HEADERS)
    assert row.split()[:3] == ["report", "lease", "live"] and "tasks.r[t1]" in row
    assert header.index("TASK") == row.index("tasks.r[t1]")  # aligned columns
    assert "\x1b[" not in table.output  # not a terminal: no color
    none = run_plain(lock_redis_url, lock_prefix, "list", "--pattern", "nope*")
    assert none.exit_code == 1 and "no locks" in none.stderr


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server of this test's own: what other prefixes hold must be only what it puts."""
    with RedisServer() as server:
        yield server


def test_an_empty_listing_names_the_prefixes_that_hold_locks(own_server: RedisServer) -> None:
    url = own_server.url
    client = LockClient.from_url(url, prefix="myapp:")
    try:
        hold(client, "job")
        reader = client.rwlock("doc").read(ttl=30)
        assert reader.acquire()
        # The layout's names holding another type are not this package's holds.
        client.redis.set("junk{x}:lock", "a string")
        client.redis.set("plain-key", "1")

        empty = run_plain(url, "csl:", "list")
        assert empty.exit_code == 1 and "no locks" in empty.stderr, empty.output
        assert "under prefix 'myapp:' (2 key(s)), not 'csl:'" in empty.stderr, empty.stderr
        assert "pass --prefix myapp:" in empty.stderr and "junk" not in empty.stderr
        as_json = run_plain(url, "csl:", "list", "--json")  # stdout stays the JSON list
        assert json.loads(as_json.stdout) == [] and "--prefix myapp:" in as_json.stderr
        # A filter that matched nothing says nothing more; nor does a listing that found locks.
        filtered = run_plain(url, "csl:", "list", "--pattern", "nope*")
        assert filtered.exit_code == 1 and "--prefix" not in filtered.output
        listed = run_plain(url, "myapp:", "list")
        assert listed.exit_code == 0 and "--prefix" not in listed.output
        # `celery locks` reads the prefix from the app: it names the setting.
        app = Celery(f"csltest-{uuid.uuid4().hex[:8]}", set_as_current=False)
        app.conf.update(broker_url="memory://", singleton_lock_url=url)
        via_app = run_celery(app, "--timeout", "0", "list")
        assert via_app.exit_code == 1, via_app.output
        assert "set singleton_lock_prefix = 'myapp:'" in via_app.stderr, via_app.stderr
        app.close()
        reader.release()
    finally:
        client.close()


def test_the_prefix_search_reads_a_bounded_number_of_keys(own_server: RedisServer) -> None:
    from celery_singleton_lock.admin.prefixes import find_prefixes

    client = LockClient.from_url(own_server.url, prefix="myapp:")
    try:
        client.redis.mset({f"filler-{n}": n for n in range(200)})
        hold(client, "job")
        bounded = find_prefixes(client, max_keys=50)
        assert (bounded.scanned, bounded.capped) == (50, True)
        whole = find_prefixes(client)
        # The fillers, the lock, its fence and the prefix's key layout record.
        assert whole == ([("myapp:", 1)], 203, False)
    finally:
        client.close()


def test_plain_reads_redis_url_from_the_environment(
    lock_client: LockClient, lock_redis_url: str, lock_prefix: str
) -> None:
    hold(lock_client, "env-job")
    result = run_plain(None, lock_prefix, "list", "--json", env={"REDIS_URL": lock_redis_url})
    assert result.exit_code == 0 and names_in(result) == ["env-job"]
    missing = run_plain(None, lock_prefix, "list", env={"REDIS_URL": None})
    assert missing.exit_code == 2 and "no Redis URL" in missing.stderr


def test_list_stale_and_show(
    lock_client: LockClient, lock_redis_url: str, lock_prefix: str
) -> None:
    hold(lock_client, "fine")
    make_stale(lock_client, hold(lock_client, "dead", heartbeat=False, owner_info={"job": "x"}))
    stale = run_plain(lock_redis_url, lock_prefix, "list", "--stale", "--json")
    assert stale.exit_code == 0 and names_in(stale) == ["dead"]
    shown = run_plain(lock_redis_url, lock_prefix, "show", "dead")
    assert shown.exit_code == 0
    lines = dict(line.split(None, 1) for line in shown.stdout.splitlines())
    assert (lines["name"], lines["state"], lines["evidence"]) == (
        "dead",
        "stale",
        "heartbeat stopped",
    )
    assert lines["info"] == '{"job": "x"}'
    as_json = run_plain(lock_redis_url, lock_prefix, "show", "fine", "--json")
    assert as_json.exit_code == 0 and json.loads(as_json.stdout)[0]["state"] == "live"
    missing = run_plain(lock_redis_url, lock_prefix, "show", "nothing")
    assert missing.exit_code == 1 and "no lock named 'nothing'" in missing.stderr


def test_connection_error_names_the_url_without_password(
    restartable_redis: RedisServer, lock_prefix: str
) -> None:
    port = restartable_redis.port
    restartable_redis.stop()
    url = f"redis://admin:s3cret-pw@127.0.0.1:{port}/0"
    for args in (["list"], ["show", "x"], ["clear", "--all", "--yes"]):
        result = run_plain(url, lock_prefix, *args)
        assert result.exit_code == 2, result.output
        assert f"127.0.0.1:{port}" in result.stderr
        assert "s3cret" not in result.output
    bad = run_plain("http://admin:s3cret-pw@host/0", lock_prefix, "list")
    assert bad.exit_code == 2 and "url" in bad.stderr and "s3cret" not in bad.output


# -- clear -----------------------------------------------------------------------------------


def test_clear_refuses_without_yes_when_there_is_no_terminal(
    lock_client: LockClient, lock_redis_url: str, lock_prefix: str
) -> None:
    make_stale(lock_client, hold(lock_client, "dead", heartbeat=False))
    result = run_plain(lock_redis_url, lock_prefix, "clear", "dead")
    assert result.exit_code == 2 and "--yes" in result.stderr
    assert [info.name for info in lock_client.locks()] == ["dead"]


def test_clear_live_needs_force(
    lock_client: LockClient, lock_redis_url: str, lock_prefix: str
) -> None:
    lease = hold(lock_client, "busy")
    refused = run_plain(lock_redis_url, lock_prefix, "clear", "busy", "--yes")
    assert refused.exit_code == 2 and "live" in refused.stderr and "--force" in refused.stderr
    assert lease.held and [info.name for info in lock_client.locks()] == ["busy"]
    done = run_plain(lock_redis_url, lock_prefix, "clear", "busy", "--yes", "--force")
    assert done.exit_code == 0 and "cleared busy" in done.stdout
    assert lock_client.locks() == []
    again = run_plain(lock_redis_url, lock_prefix, "clear", "busy", "--yes", "--force")
    assert again.exit_code == 1


def test_clear_stale_leaves_live_locks(
    lock_client: LockClient, lock_redis_url: str, lock_prefix: str
) -> None:
    hold(lock_client, "alive")
    for name in ("dead-1", "dead-2", "gone"):
        make_stale(lock_client, hold(lock_client, name, heartbeat=False))
    result = run_plain(
        lock_redis_url, lock_prefix, "clear", "--stale", "--pattern", "dead-*", "--yes"
    )
    assert result.exit_code == 0 and "cleared 2 of 2" in result.stdout
    assert sorted(info.name for info in lock_client.locks()) == ["alive", "gone"]
    result = run_plain(lock_redis_url, lock_prefix, "clear", "--stale", "--yes")
    assert result.exit_code == 0
    assert [info.name for info in lock_client.locks()] == ["alive"]
    nothing = run_plain(lock_redis_url, lock_prefix, "clear", "--stale", "--yes")
    assert nothing.exit_code == 1 and "nothing cleared" in nothing.stderr
    everything = run_plain(lock_redis_url, lock_prefix, "clear", "--all", "--yes")
    assert everything.exit_code == 2  # "alive" is live
    everything = run_plain(lock_redis_url, lock_prefix, "clear", "--all", "--yes", "--force")
    assert everything.exit_code == 0 and lock_client.locks() == []


@pytest.mark.parametrize(
    "args",
    [[], ["x", "--all"], ["--stale", "--all"], ["x", "--pattern", "y"], ["--bogus"]],
)
def test_clear_usage_errors(lock_redis_url: str, lock_prefix: str, args: list[str]) -> None:
    result = run_plain(lock_redis_url, lock_prefix, "clear", *args)
    assert result.exit_code == 2, result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--purged", "--stale"], "--purged goes with --unqueued"),
        (["--unqueued", "--all"], "exactly one of them"),
        (["--unqueued"], "needs the app's broker and workers"),
    ],
)
def test_clear_unqueued_usage_errors(
    lock_redis_url: str, lock_prefix: str, args: list[str], says: str
) -> None:
    result = run_plain(lock_redis_url, lock_prefix, "clear", *args)
    assert result.exit_code == 2 and says in result.output, result.output


def test_clear_typed_confirmation(
    lock_client: LockClient,
    lock_redis_url: str,
    lock_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_stale(lock_client, hold(lock_client, "dead", heartbeat=False))
    declined = run_plain(lock_redis_url, lock_prefix, "clear", "dead", input="y\n", terminal=True)
    assert declined.exit_code == 1 and "Type 'yes'" in declined.output
    # The prompt line ends at its colon: click shows an empty default as a stray "[]".
    prompt = next(line for line in declined.output.splitlines() if "Type 'yes'" in line)
    assert prompt.startswith("Type 'yes' to clear these 1 lock(s): "), prompt
    assert "[]" not in declined.output, declined.output
    assert [info.name for info in lock_client.locks()] == ["dead"]
    confirmed = run_plain(
        lock_redis_url, lock_prefix, "clear", "dead", input="yes\n", terminal=True
    )
    assert confirmed.exit_code == 0 and lock_client.locks() == []


def test_clear_leaves_a_lock_taken_again_while_asking(
    lock_client: LockClient,
    lock_redis_url: str,
    lock_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = hold(lock_client, "contested", heartbeat=False)
    make_stale(lock_client, old)
    taken: list[Any] = []

    def prompt_while_someone_takes_it(*args: Any, **kwargs: Any) -> str:
        lock_client.redis.delete(old.keys.lock)
        taken.append(hold(lock_client, "contested"))
        return "yes"

    monkeypatch.setattr(click, "prompt", prompt_while_someone_takes_it)
    result = run_plain(lock_redis_url, lock_prefix, "clear", "contested", terminal=True)
    assert result.exit_code == 1 and "left contested" in result.stdout
    assert taken[0].held
    assert lock_client.redis.hget(old.keys.lock, "owner") == taken[0].owner.encode()


def test_color_only_on_a_terminal_without_no_color(
    lock_client: LockClient,
    lock_redis_url: str,
    lock_prefix: str,
    celery_lock_app: Celery,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hold(lock_client, "colored")
    monkeypatch.delenv("NO_COLOR", raising=False)

    def colored(result: Result) -> bool:
        assert result.exit_code == 0 and "colored" in result.stdout, result.output
        return "\x1b[" in result.stdout

    assert colored(run_plain(lock_redis_url, lock_prefix, "list", terminal=True))
    assert not colored(run_plain(lock_redis_url, lock_prefix, "list"))  # not a terminal
    no_color = CLIContext(app=celery_lock_app, no_color=True, workdir=None)
    assert not colored(
        TerminalRunner().invoke(commands.locks, ["list"], obj=no_color, catch_exceptions=False)
    )  # celery --no-color
    monkeypatch.setenv("NO_COLOR", "1")
    assert not colored(run_plain(lock_redis_url, lock_prefix, "list", terminal=True))


# -- celery locks ----------------------------------------------------------------------------


def test_app_settings() -> None:
    def settings(**conf: Any) -> tuple[str | None, str]:
        app = Celery("settings", set_as_current=False)
        app.conf.update(conf)
        session = commands.app_session(app, timeout=1, no_color=True)
        return session.url, session.prefix

    assert settings(broker_url="redis://b:6379/1") == ("redis://b:6379/1", "csl:")
    assert settings(broker_url="rediss://b/1")[0] == "rediss://b/1"
    assert settings(broker_url="unix:///tmp/r.sock")[0] == "unix:///tmp/r.sock"
    assert settings(broker_url="amqp://x//", singleton_lock_url="redis://l/2") == (
        "redis://l/2",
        "csl:",
    )
    assert settings(broker_url="redis://b/1", singleton_lock_prefix="app1:")[1] == "app1:"
    with pytest.raises(click.UsageError, match="singleton_lock_url"):
        settings(broker_url="amqp://guest@rabbit//")


def test_celery_group_in_process(app: Celery, lock_client: LockClient, lock_redis_url: str) -> None:
    hold(lock_client, "via-celery")
    result = run_celery(app, "--timeout", "0", "list", "--json")  # URL from the redis broker
    assert result.exit_code == 0, result.output
    assert names_in(result) == ["via-celery"]
    helped = run_celery(app, "--help")
    assert "Lock Options" in helped.stdout and "clear" in helped.stdout
    assert "List Options" in run_celery(app, "list", "--help").stdout
    app.conf.broker_url = "amqp://guest@localhost//"
    no_url = run_celery(app, "list")
    assert no_url.exit_code == 2 and "singleton_lock_url" in no_url.stderr
    app.conf.singleton_lock_url = lock_redis_url
    assert run_celery(app, "--timeout", "0", "show", "via-celery").exit_code == 0


def test_real_celery_program(
    lock_client: LockClient, lock_redis_url: str, lock_prefix: str
) -> None:
    hold(lock_client, "from-subprocess", owner_info={"task_id": "t7", "task_name": "tasks.x"})
    env = dict(
        os.environ,
        PYTHONPATH=str(TESTS),
        CSL_TEST_LOCK_URL=lock_redis_url,
        CSL_TEST_LOCK_PREFIX=lock_prefix,
    )
    env.pop("NO_COLOR", None)
    command = [str(CELERY), "-A", "apps.locks_cli_app", "locks", "--csl-test-flag"]
    listed = subprocess.run(
        [*command, "--timeout", "0", "list", "--json"], env=env, capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr
    (item,) = json.loads(listed.stdout)
    assert (item["name"], item["state"], item["task_id"]) == ("from-subprocess", "live", "t7")
    env["CSL_TEST_LOCK_URL"] = "redis://admin:s3cret-pw@127.0.0.1:1/0"
    failed = subprocess.run([*command, "list"], env=env, capture_output=True, text=True)
    assert failed.returncode == 2
    assert "127.0.0.1:1" in failed.stderr and "s3cret" not in failed.stderr + failed.stdout


def test_evidence_from_live_workers(app: Celery, lock_client: LockClient) -> None:
    started, finish = threading.Event(), threading.Event()

    @app.task(bind=True, name="csltest.hold_lock")
    def hold_lock(self: Any) -> None:
        info = {"task_id": self.request.id, "task_name": self.name}
        with lock_client.lease("held-by-task", ttl=30, owner_info=info):
            started.set()
            finish.wait(20)

    node = f"csltest-{uuid.uuid4().hex[:8]}@{socket.gethostname()}"
    with start_worker(
        app,
        pool="threads",
        concurrency=2,
        hostname=node,
        perform_ping_check=False,
        shutdown_timeout=20,
    ):
        try:
            hold_lock.delay()
            assert started.wait(15)
            # Its own worker answers without its task, and it has no heartbeat to say more.
            hold(
                lock_client,
                "orphan",
                heartbeat=False,
                owner_info={"task_id": "gone", "task_name": "x", "worker": node},
            )
            # A fresh heartbeat wins over "not active": something still renews it.
            hold(lock_client, "renewed", owner_info={"task_id": "gone-3", "worker": node})
            hold(
                lock_client,
                "elsewhere",
                heartbeat=False,
                owner_info={"task_id": "gone-2", "worker": "celery@another-machine"},
            )
            deadline = time.monotonic() + 10
            while not app.control.inspect(timeout=0.5).ping():
                assert time.monotonic() < deadline, "the worker never answered"
            result = run_celery(app, "--timeout", "2", "list", "--json")
            assert result.exit_code == 0, result.output
            states = {d["name"]: (d["state"], d["evidence"]) for d in json.loads(result.stdout)}
            assert states["held-by-task"][0] == "live"
            assert states["held-by-task"][1].startswith("active on worker ")
            assert states["orphan"] == ("stale", f"not active on its worker {node}")
            assert states["renewed"] == ("live", "heartbeat fresh")
            # The holder's worker did not answer: no evidence either way.
            assert states["elsewhere"] == ("live", "no evidence")
            asked_nobody = run_celery(app, "--timeout", "0", "list", "--stale")
            assert asked_nobody.exit_code == 1
        finally:
            finish.set()


def test_evidence_from_the_result_backend(app: Celery, lock_client: LockClient) -> None:
    done, revoked, pending, rerun = (f"task-{uuid.uuid4().hex}" for _ in range(4))
    app.backend.store_result(done, 42, "SUCCESS")
    app.backend.mark_as_revoked(revoked)
    app.backend.store_result(rerun, 42, "SUCCESS")
    for task_id in (done, revoked, pending):
        hold(lock_client, f"lock-{task_id}", owner_info={"task_id": task_id}, heartbeat=False)
    # A run renewing its lock under a task id that already stored SUCCESS (a message
    # redelivered after its first run finished): the fresh heartbeat wins.
    hold(lock_client, f"lock-{rerun}", owner_info={"task_id": rerun})
    # No worker answers within the timeout: only the result backend gives evidence.
    result = run_celery(app, "--timeout", "0.3", "list", "--json")
    states = {d["task_id"]: (d["state"], d["evidence"]) for d in json.loads(result.stdout)}
    assert states == {
        done: ("stale", "result backend: SUCCESS"),
        revoked: ("stale", "result backend: REVOKED"),
        pending: ("live", "no evidence"),
        rerun: ("live", "heartbeat fresh"),
    }
    cleared = run_celery(app, "--timeout", "0", "clear", "--stale", "--yes")
    assert cleared.exit_code == 0 and "cleared 2 of 2" in cleared.stdout
    assert sorted(info.task_id or "" for info in lock_client.locks()) == sorted([pending, rerun])


def test_python_dash_m(lock_client: LockClient, lock_redis_url: str, lock_prefix: str) -> None:
    hold(lock_client, "run-as-module")
    env = dict(os.environ, REDIS_URL=lock_redis_url)
    command = [sys.executable, "-m", "celery_singleton_lock", "--prefix", lock_prefix]
    listed = subprocess.run([*command, "list", "--json"], env=env, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    assert [item["name"] for item in json.loads(listed.stdout)] == ["run-as-module"]
    helped = subprocess.run([*command, "--help"], env=env, capture_output=True, text=True)
    assert helped.stdout.startswith("Usage: python -m celery_singleton_lock")


def test_clear_stale_leaves_a_lock_whose_heartbeat_resumed_while_asking(
    lock_client: LockClient, lock_redis_url: str, lock_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clear re-checks staleness in its own script: a holder that woke up while the
    operator read the list keeps its lock."""
    lease = hold(lock_client, "cool")
    heartbeat().remove(lease)  # paused: no background tick lands between listing and clear
    make_stale(lock_client, lease)

    def prompt_while_the_holder_wakes_up(*args: Any, **kwargs: Any) -> str:
        lease.extend()  # renews, and rejoins the heartbeat
        return "yes"

    monkeypatch.setattr(click, "prompt", prompt_while_the_holder_wakes_up)
    result = run_plain(lock_redis_url, lock_prefix, "clear", "--stale", terminal=True)
    assert result.exit_code == 1, result.output
    assert "left cool (lease, token" in result.stdout
    assert "alone: heartbeat resumed since it was listed stale" in result.stdout
    assert "cleared 0 of 1 lock(s)" in result.stdout
    heartbeat().tick()  # a cleared holder would find out here
    assert lease.held and not lease.lost
    assert [info.state for info in lock_client.locks("cool")] == ["live"]
    lease.release()
