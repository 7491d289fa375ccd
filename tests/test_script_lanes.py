"""Each thread's own connection for script calls (core/lanes.py): one per thread and pool,
never shared by two calls at once, nor across a fork, closed with its thread or its client,
polled before the send, and left out where the pool must see every connection. A lane
killed or timed out mid-call: test_script_calls.py, for both paths."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from support.forked import run_in_child
from support.script_calls import COUNTER, SLOW_COUNTER, call_in_thread
from support.waiting import wait_for

from celery_singleton_lock import LockClient
from celery_singleton_lock.core.lanes import lanes_of
from celery_singleton_lock.core.scripts import register
from celery_singleton_lock.embedded import RedisServer

ECHO = "return ARGV[1]"


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        yield started


@pytest.fixture
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    yield client
    client.close()


def script_connections(admin: redis.Redis) -> set[int]:
    """The ids of the server's connections whose last command was a script call."""
    return {int(entry["id"]) for entry in admin.client_list() if entry.get("cmd") == "evalsha"}


def test_a_thread_sends_every_script_call_on_one_connection_of_its_own(
    server: RedisServer, admin: redis.Redis
) -> None:
    client = redis.Redis.from_url(server.url)
    counter = register(client, COUNTER)
    echo = register(client, ECHO)
    assert counter(keys=("n",)) == 1
    first = script_connections(admin)
    assert len(first) == 1
    assert [counter(keys=("n",)) for _ in range(5)] == [2, 3, 4, 5, 6]
    assert echo(args=("x",)) == b"x"  # another script of the same client: the same lane
    client.ping()  # on the pool's connection: the scripts' is another
    assert script_connections(admin) == first


def test_threads_have_lanes_of_their_own_and_their_replies_never_mix(
    server: RedisServer, admin: redis.Redis
) -> None:
    client = redis.Redis.from_url(server.url)
    echo = register(client, ECHO)
    threads, calls = 4, 300
    replied = threading.Barrier(threads + 1)
    done = threading.Event()
    wrong: list[tuple[str, Any]] = []

    def run(name: str) -> None:
        for i in range(calls):
            sent = f"{name}:{i}"
            reply = echo(args=(sent,))
            if reply != sent.encode():
                wrong.append((sent, reply))
        replied.wait(60)
        done.wait(60)

    workers = [threading.Thread(target=run, args=(f"t{n}",)) for n in range(threads)]
    for worker in workers:
        worker.start()
    replied.wait(60)
    try:
        assert wrong == []
        assert len(script_connections(admin)) == threads
    finally:
        done.set()
        for worker in workers:
            worker.join(10)
    # A thread's lane closes when the thread ends.
    wait_for(lambda: not script_connections(admin), 10, "the ended threads' lanes to close")


class ReenteringConnection(redis.Connection):
    """Runs ``reenter`` (once) while waiting for a reply, as a signal handler may."""

    reenter: Any = None

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        reenter, type(self).reenter = type(self).reenter, None
        if reenter is not None:
            reenter()
        return super().read_response(*args, **kwargs)


def test_a_call_made_while_the_threads_lane_waits_goes_through_the_pool(
    server: RedisServer, admin: redis.Redis
) -> None:
    client = redis.Redis.from_url(server.url, connection_class=ReenteringConnection)
    counter = register(client, COUNTER)
    assert counter(keys=("n",)) == 1
    inner: list[Any] = []
    ReenteringConnection.reenter = lambda: inner.append(counter(keys=("n",)))
    assert counter(keys=("n",)) == 2  # sent first, so run first
    assert inner == [3]  # on a pooled connection, not read off the lane
    assert len(script_connections(admin)) == 2
    assert counter(keys=("n",)) == 4  # the lane is free again


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() with threads running
def test_a_forked_child_calls_on_a_connection_of_its_own(
    server: RedisServer, admin: redis.Redis
) -> None:
    client = redis.Redis.from_url(server.url)
    counter = register(client, COUNTER)
    assert counter(keys=("n",)) == 1
    (parents,) = script_connections(admin)

    def child() -> dict[str, Any]:
        replies = [counter(keys=("n",)) for _ in range(3)]
        return {"replies": replies, "connections": sorted(script_connections(admin))}

    report = run_in_child(child)
    assert report["replies"] == [2, 3, 4]
    assert len(report["connections"]) == 2 and parents in report["connections"]
    assert counter(keys=("n",)) == 5
    wait_for(lambda: script_connections(admin) == {parents}, 10, "the child's lane to close")


def test_a_lane_the_server_closed_while_idle_is_reconnected_before_the_send(
    server: RedisServer, admin: redis.Redis
) -> None:
    """No retries: a lane found closed after the send would raise; polled first, it is
    reconnected to and the call runs once."""
    client = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0))
    counter = register(client, COUNTER)
    assert counter(keys=("n",)) == 1
    admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert counter(keys=("n",)) == 2
    server.stop()
    server.start()
    assert counter(keys=("n",)) == 1  # a new, empty server; the script loaded again


class CountingPool(redis.ConnectionPool):
    """A pool subclass (instrumentation, say): it sees every checkout."""


@pytest.mark.parametrize(
    "make_pool",
    [
        lambda url: redis.BlockingConnectionPool.from_url(url, max_connections=2, timeout=10),
        lambda url: CountingPool.from_url(url, max_connections=2),
    ],
    ids=["blocking", "subclass"],
)
def test_pools_that_must_see_every_connection_keep_the_pooled_path(
    server: RedisServer, admin: redis.Redis, make_pool: Any
) -> None:
    """Calls from 6 threads at once on a pool capped at 2 connections open 2, not 6 (the
    blocking pool makes the others wait, the subclass raises "Too many connections")."""
    client = redis.Redis(connection_pool=make_pool(server.url))
    assert lanes_of(client) is None
    slow = register(client, SLOW_COUNTER)
    threads = [call_in_thread(slow, ("n",), (100_000,)) for _ in range(6)]
    for thread, _ in threads:
        thread.join(20)
    ran = [outcome[0] for _, outcome in threads if isinstance(outcome[0], int)]
    assert len(ran) >= 2 and sorted(ran) == list(range(1, len(ran) + 1))
    # The pooled connections (two, or one if the threads came one after another) are still
    # open, back in the pool; lanes would have closed with their threads.
    assert 1 <= len(script_connections(admin)) <= 2
    assert lanes_of(redis.Redis.from_url(server.url)) is not None


def test_closing_a_lock_client_closes_its_lanes(server: RedisServer, admin: redis.Redis) -> None:
    client = LockClient.from_url(server.url)
    lease = client.lease("job", ttl=30)
    assert lease.acquire()
    lease.release()
    assert len(script_connections(admin)) == 1
    client.close()
    wait_for(lambda: not script_connections(admin), 10, "the lane to close")


@pytest.mark.parametrize(
    ("patch", "lanes"),
    [
        ("", True),
        ("import gevent.monkey; gevent.monkey.patch_all()", False),
        ("import eventlet; eventlet.monkey_patch()", False),
    ],
    ids=["threads", "gevent", "eventlet"],
)
def test_green_threads_keep_the_pooled_path(patch: str, lanes: bool) -> None:
    """Under gevent or eventlet a thread-local is a greenlet's: each task would open a
    connection of its own."""
    code = (
        f"{patch}\n"
        "import redis\n"
        "from celery_singleton_lock.core.lanes import lanes_of\n"
        "print(lanes_of(redis.Redis()) is not None)\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(lanes)
