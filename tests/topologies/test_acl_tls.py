"""ACL logins (``redis://user:password@``), TLS (``rediss://``) and the URL forms of
docs/deployment.md, against real servers started here. The password must never show: not in
``LockClient.url``, ``repr``, ``LockBackendError``, ``ConfigurationError`` nor the admin
command's output."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner, Result
from support.redis_topologies import ACLServer, TLSServer, running

from celery_singleton_lock import AsyncLockClient, LockClient
from celery_singleton_lock.celery.options import AppSettings
from celery_singleton_lock.celery.task import lock_client_for
from celery_singleton_lock.cli import commands
from celery_singleton_lock.core import redis_urls
from celery_singleton_lock.embedded import RedisServer
from celery_singleton_lock.exceptions import ConfigurationError, LockBackendError

PASSWORD = "pw-" + uuid.uuid4().hex  # unique: found nowhere unless leaked


@pytest.fixture(scope="module")
def acl() -> Iterator[ACLServer]:
    server = ACLServer(PASSWORD)
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def tls() -> Iterator[TLSServer]:
    with running(TLSServer()) as server:
        yield server


def run_cli(url: str, prefix: str, *args: str) -> Result:
    return CliRunner().invoke(commands.main, ["--url", url, "--prefix", prefix, *args])


def exercise(client: LockClient) -> None:
    """Lease, waiter wake-up, reader-writer, range and multi locks on ``client``."""
    lease = client.lease("acl-job", ttl=5)
    assert lease.acquire() and lease.token
    waiter = client.lease("acl-job", ttl=5)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(wait=10)))
    thread.start()
    # The waiter is subscribed once Redis counts its subscriber on the lock's channel.
    probe = client.redis
    channel = client.connection.keys("acl-job").channel
    deadline = time.monotonic() + 5
    while probe.pubsub_numsub(channel)[0][1] == 0:
        assert time.monotonic() < deadline, "the waiter never subscribed"
        time.sleep(0.01)  # polling the server's subscriber count, with a deadline
    started = time.monotonic()
    lease.release()
    thread.join(10)
    assert got == [True] and time.monotonic() - started < 1.0  # woken, not its 5 s hint
    assert waiter.token is not None and waiter.token > (lease.token or 0)
    waiter.release()
    with client.rwlock("acl-rw").read(ttl=5), client.rwlock("acl-rw").read(ttl=5):
        assert not client.rwlock("acl-rw").write(ttl=5).acquire()
    with client.range_lock("acl-range").write(0, 10, ttl=5):
        with client.range_lock("acl-range").write(11, 20, ttl=5) as other:
            assert other.held
        assert not client.range_lock("acl-range").read(10, 11, ttl=5).acquire()
    with client.multi(["acl-a", "acl-b"], ttl=5) as multi:
        assert multi.held and set(multi.tokens) == {"acl-a", "acl-b"}


def test_acl_login_end_to_end(acl: ACLServer, prefix: str) -> None:
    client = LockClient.from_url(acl.url, prefix=prefix)
    try:
        assert client.url == f"redis://{acl.USER}@127.0.0.1:{acl.port}/0"
        assert PASSWORD not in repr(client)
        assert client.ping()
        # The default user is off: the login is what lets us in.
        anonymous = LockClient.from_url(f"redis://127.0.0.1:{acl.port}/0", prefix=prefix)
        with pytest.raises(LockBackendError):
            anonymous.ping()
        anonymous.close()
        exercise(client)
        held = client.lease("acl-listed", ttl=30, heartbeat=False)
        assert held.acquire()
        assert [info.name for info in client.locks()] == ["acl-listed"]
        listed = run_cli(acl.url, prefix, "list", "--json")
        assert listed.exit_code == 0, listed.output
        assert "acl-listed" in listed.output and PASSWORD not in listed.output
        cleared = run_cli(acl.url, prefix, "clear", "acl-listed", "--force", "--yes")
        assert cleared.exit_code == 0, cleared.output
        assert PASSWORD not in cleared.output and client.locks() == []
    finally:
        client.close()


def test_password_never_shows_in_errors(acl: ACLServer, prefix: str) -> None:
    wrong = f"redis://{acl.USER}:{PASSWORD}x@127.0.0.1:{acl.port}/0"
    client = LockClient.from_url(wrong, prefix=prefix)
    with pytest.raises(LockBackendError) as refused:
        client.lease("x").acquire()
    assert "127.0.0.1" in str(refused.value) and PASSWORD not in str(refused.value)
    assert PASSWORD not in repr(client) and PASSWORD not in client.url
    client.close()
    result = run_cli(wrong, prefix, "list")
    assert result.exit_code == 2 and PASSWORD not in result.output
    # Nobody listens on a port we just freed: a connection error names the URL, no password.
    gone = f"redis://{acl.USER}:{PASSWORD}@127.0.0.1:1/0"
    with pytest.raises(LockBackendError) as down:
        LockClient.from_url(gone, prefix=prefix).ping()
    assert "127.0.0.1:1" in str(down.value) and PASSWORD not in str(down.value)
    for bad in (
        f"redis://{acl.USER}:{PASSWORD}@127.0.0.1:notaport/0",
        f"sentinel://{acl.USER}:{PASSWORD}@127.0.0.1:26379",  # no master name
        f"redis+cluster://{acl.USER}:{PASSWORD}@127.0.0.1:7000/3",  # Cluster has db 0 only
    ):
        with pytest.raises(ConfigurationError) as invalid:
            LockClient.from_url(bad)
        assert invalid.value.argument == "url" and PASSWORD not in str(invalid.value)
    cluster_down = f"redis+cluster://{acl.USER}:{PASSWORD}@127.0.0.1:1"
    with pytest.raises(LockBackendError) as unreachable:
        LockClient.from_url(cluster_down, socket_connect_timeout=1)
    assert PASSWORD not in str(unreachable.value)


@pytest.fixture(scope="module")
def needs_password() -> Iterator[RedisServer]:
    """A plain server started with ``--requirepass``."""
    with RedisServer(password=PASSWORD) as server:
        yield server


def test_a_server_needing_a_password_says_where_it_goes(
    needs_password: RedisServer, prefix: str
) -> None:
    bare = f"redis://127.0.0.1:{needs_password.port}/0"
    client = LockClient.from_url(bare, prefix=prefix)
    try:
        with pytest.raises(LockBackendError) as refused:
            client.ping()
    finally:
        client.close()
    message = str(refused.value)
    assert "HELLO" not in message and "NOAUTH" not in message, message
    assert "needs a password" in message, message
    assert f"redis://:PASSWORD@127.0.0.1:{needs_password.port}/0" in message, message
    assert message.endswith("the URL comes from url"), message
    # The CLI: one line naming the option, no traceback, exit 2.
    result = run_cli(bare, prefix, "list")
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and "Traceback" not in result.output, result.output
    assert "needs a password" in result.output and "--url (or $REDIS_URL)" in result.output
    # A wrong password (with or without an ACL user) is told apart from a missing one.
    for login, example in ((":wrong", ":PASSWORD"), ("bob:wrong", "bob:PASSWORD")):
        result = run_cli(f"redis://{login}@127.0.0.1:{needs_password.port}/0", prefix, "list")
        assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
        assert "refused the login" in result.output and "WRONGPASS" not in result.output
        assert f"redis://{example}@127.0.0.1:{needs_password.port}/0" in result.output
        assert "wrong" not in result.output.replace("(wrong password", ""), result.output
    # A Celery app's client names the setting the URL came from.
    app = Celery(f"csltest-{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.conf.update(broker_url="memory://", singleton_lock_url=bare, singleton_lock_prefix=prefix)
    app_client = lock_client_for(app)
    try:
        with pytest.raises(LockBackendError) as from_app:
            app_client.lease("x", ttl=5, heartbeat=False).acquire()
    finally:
        app_client.close()
    assert "needs a password" in str(from_app.value)
    assert str(from_app.value).endswith("the URL comes from singleton_lock_url")
    assert PASSWORD not in str(from_app.value)


def test_the_asyncio_client_says_where_the_password_goes(
    needs_password: RedisServer, prefix: str
) -> None:
    async def ping() -> None:
        client = AsyncLockClient.from_url(
            f"redis://127.0.0.1:{needs_password.port}/0", prefix=prefix
        )
        try:
            await client.ping()
        finally:
            await client.close()

    with pytest.raises(LockBackendError, match="needs a password") as refused:
        asyncio.run(ping())
    assert "HELLO" not in str(refused.value)


def test_celery_setting_with_acl_login(acl: ACLServer, prefix: str) -> None:
    app = Celery(f"csltest-{uuid.uuid4().hex[:8]}", set_as_current=False)
    app.conf.update(
        broker_url="memory://", singleton_lock_url=acl.url, singleton_lock_prefix=prefix
    )
    assert AppSettings.from_conf(app.conf).url == acl.url
    client = lock_client_for(app)
    try:
        assert PASSWORD not in client.url and client.ping()
        exercise(client)
    finally:
        client.close()


def test_tls_end_to_end(tls: TLSServer, prefix: str) -> None:
    client = LockClient.from_url(tls.url, prefix=prefix, ssl_ca_certs=str(tls.cert))
    try:
        assert client.url == f"rediss://127.0.0.1:{tls.port}/0"
        exercise(client)  # the waiter's pub/sub connection is TLS too
    finally:
        client.close()
    # The same server refuses plain TCP: the TLS connection class is what reached it.
    plain = LockClient.from_url(f"redis://127.0.0.1:{tls.port}/0", socket_timeout=2)
    with pytest.raises(LockBackendError):
        plain.ping()
    plain.close()
    # Certificate options in the query string (redis-py's names).
    unchecked = LockClient.from_url(f"{tls.url}?ssl_cert_reqs=none", prefix=prefix)
    try:
        assert unchecked.ping()
    finally:
        unchecked.close()


def test_tls_with_acl_login(tls: TLSServer, prefix: str) -> None:
    admin = redis.Redis(host="127.0.0.1", port=tls.port, ssl=True, ssl_ca_certs=str(tls.cert))
    admin.execute_command("ACL", "SETUSER", "tlsuser", "on", f">{PASSWORD}", "~*", "&*", "+@all")
    admin.close()
    url = f"rediss://tlsuser:{PASSWORD}@127.0.0.1:{tls.port}/0"
    client = LockClient.from_url(url, prefix=prefix, ssl_ca_certs=str(tls.cert))
    try:
        assert client.url == f"rediss://tlsuser@127.0.0.1:{tls.port}/0"
        with client.lease("tls-acl", ttl=5) as lease:
            assert lease.held
    finally:
        client.close()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "sentinel://u:pw@127.0.0.1:26379,127.0.0.1:26380/mymaster/2",
            "sentinel://u@127.0.0.1:26379,127.0.0.1:26380/mymaster/2",
        ),
        (
            "sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380?master_name=mymaster",
            "sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/0",
        ),
        (
            # Kombu's form: whole URLs joined by ';', each with the login and the path.
            "sentinel://:pw@127.0.0.1:26379/mymaster/1;sentinel://:pw@127.0.0.1:26380/mymaster/1",
            "sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/1",
        ),
        (
            "sentinel://127.0.0.1:26379/0;redis+sentinel://:pw@[::1]:26380/0?master_name=m",
            "sentinel://127.0.0.1:26379,::1:26380/m/0",
        ),
        ("redis+sentinel://[::1]/mymaster", "sentinel://::1:26379/mymaster/0"),
        ("rediss+sentinel://:pw@10.0.0.1:5000/m", "rediss+sentinel://10.0.0.1:5000/m/0"),
    ],
)
def test_sentinel_url_forms(url: str, expected: str) -> None:
    # Making a Sentinel client does no I/O; the master is looked up on first use.
    client = LockClient.from_url(url)
    assert client.url == expected
    pool: Any = client.redis.connection_pool
    assert pool.service_name == expected.split("/")[3]
    tls = expected.startswith("rediss")
    assert ("SSL" in pool.connection_class.__name__) is tls
    for sentinel in pool.sentinel_manager.sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        assert kwargs.get("password") is None  # the login is the master's
        assert ("SSL" in sentinel.connection_pool.connection_class.__name__) is tls
    if "pw@" in url:
        assert pool.connection_kwargs["password"] == "pw"


def test_multi_host_url_errors() -> None:
    for bad in (
        "redis+cluster://",
        "sentinel://h:x/m",
        "sentinel://h/m/0/extra",
        # Two logins, or two masters, in one Kombu list: which applies is not ours to guess.
        "sentinel://:a@h1/m;sentinel://:b@h2/m",
        "sentinel://h1/m1;sentinel://h2/m2",
        "sentinel://h1/m;redis://h2/m",
    ):
        with pytest.raises(ConfigurationError):
            LockClient.from_url(bad)
    assert redis_urls.is_cluster(redis.Redis()) is False
