"""Script calls (core/scripts.py) go through the client's public API on a connection of its
pool: one checkout per call, whatever the client's class or its ``execute_command`` and
response callbacks do, loaded again after ``SCRIPT FLUSH`` or a restart, and never leaving a
reply unread on a connection used again."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from support.forked import FORKS_WITH_THREADS, run_in_child
from support.script_calls import COUNTER, SLOW_COUNTER, call_in_thread, evalsha_postponed
from support.waiting import wait_for

from celery_singleton_lock.core.scripts import joined, joined_call, register
from celery_singleton_lock.embedded import RedisServer

ECHO = "return {ARGV[1], tonumber(ARGV[2]), 'text'}"
FAILING = "return redis.error_reply('refused: ' .. ARGV[1])"


class CountingPool(redis.ConnectionPool):
    """A pool that counts its checkouts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.checkouts = 0

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        self.checkouts += 1
        return super().get_connection(*args, **kwargs)


class CountingClient(redis.Redis):
    """A client whose class replaces execute_command, as instrumentation libraries do."""

    calls = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        type(self).calls += 1
        return super().execute_command(*args, **options)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        yield started


def pooled_client(server: RedisServer, **kwargs: Any) -> redis.Redis:
    pool = CountingPool.from_url(server.url, **kwargs)
    return redis.Redis(connection_pool=pool)


def test_a_plain_client_sends_on_a_pooled_connection(server: RedisServer) -> None:
    client = pooled_client(server)
    script = register(client, ECHO)
    assert script(args=("a", 7)) == [b"a", 7, b"text"]
    pool = client.connection_pool
    assert isinstance(pool, CountingPool)
    checkouts = pool.checkouts
    CountingClient.calls = 0
    assert script(keys=("k",), args=("b", 8)) == [b"b", 8, b"text"]
    assert pool.checkouts == checkouts + 1  # one checkout, no SCRIPT LOAD, no retry


def test_a_client_whose_class_replaced_execute_command_keeps_it(server: RedisServer) -> None:
    client = CountingClient.from_url(server.url)
    CountingClient.calls = 0
    script = register(client, COUNTER)
    assert [script(keys=("n",)) for _ in range(3)] == [1, 2, 3]
    assert CountingClient.calls >= 3  # EVALSHA (and SCRIPT LOAD) went through it


def test_a_client_whose_execute_command_was_replaced_keeps_it(server: RedisServer) -> None:
    client = redis.Redis.from_url(server.url)
    script = register(client, COUNTER)
    sent: list[object] = []
    send = client.execute_command

    def counting(*args: Any, **options: Any) -> Any:
        sent.append(args[0])
        return send(*args, **options)

    client.execute_command = counting  # type: ignore[method-assign]
    assert [script(keys=("n",)) for _ in range(2)] == [1, 2]
    assert sent[-2:] == ["EVALSHA", "EVALSHA"]


@pytest.mark.parametrize("command", ["EVALSHA", "evalsha"])
def test_a_client_with_an_evalsha_response_callback_keeps_it(
    server: RedisServer, command: str
) -> None:
    client = redis.Redis.from_url(server.url)
    client.set_response_callback(command, lambda reply, **_: ("parsed", reply))
    script = register(client, COUNTER)
    assert script(keys=("n",)) == ("parsed", 1)


@pytest.mark.parametrize("decode", [False, True])
def test_the_reply_is_what_execute_command_returns(server: RedisServer, decode: bool) -> None:
    client = redis.Redis.from_url(server.url, decode_responses=decode)
    script = register(client, ECHO)
    fast = script(args=("x", 3))
    ordinary = client.execute_command("EVALSHA", script.sha, 0, "x", 3)
    assert fast == ordinary
    assert [type(item) for item in fast] == [type(item) for item in ordinary]
    assert fast[0] == ("x" if decode else b"x")


def test_a_reply_error_leaves_the_connection_in_the_pool_usable(server: RedisServer) -> None:
    client = pooled_client(server, max_connections=1)
    failing, echo = register(client, FAILING), register(client, ECHO)
    assert echo(args=("warm", 1)) == [b"warm", 1, b"text"]
    connection = client.connection_pool._available_connections[0]  # type: ignore[attr-defined]
    socket = connection._sock
    with pytest.raises(redis.ResponseError, match="refused: no"):
        failing(args=("no",))
    assert echo(args=("after", 2)) == [b"after", 2, b"text"]
    # The same connection, never closed: an error reply is read in full.
    assert client.connection_pool._available_connections == [connection]  # type: ignore[attr-defined]
    assert connection._sock is socket


def test_script_flush_then_a_call_loads_the_script_again(server: RedisServer) -> None:
    client = pooled_client(server)
    script = register(client, COUNTER)
    assert script(keys=("n",)) == 1
    client.script_flush()
    assert script(keys=("n",)) == 2
    assert client.script_exists(script.sha) == [True]


def test_a_restarted_server_is_reconnected_to_and_the_script_loaded(server: RedisServer) -> None:
    client = pooled_client(server)
    script = register(client, ECHO)
    assert script(args=("one", 1)) == [b"one", 1, b"text"]
    server.stop()
    server.start()
    assert script(args=("two", 2)) == [b"two", 2, b"text"]


def test_a_single_connection_client_works(server: RedisServer) -> None:
    client = redis.Redis.from_url(server.url, single_connection_client=True)
    script = register(client, COUNTER)
    assert [script(keys=("n",)) for _ in range(3)] == [1, 2, 3]
    client.close()


def test_a_pipeline_keeps_its_own_path(server: RedisServer) -> None:
    client = pooled_client(server)
    script = register(client, COUNTER)
    pipe = client.pipeline()
    script(keys=("n",), client=pipe)
    script(keys=("n",), client=pipe)
    assert pipe.execute() == [1, 2]


def client_on(server: RedisServer, path: str, **kwargs: Any) -> redis.Redis:
    """A client on a pool of one connection ("one"), or on redis-py's default pool."""
    if path == "one":
        return pooled_client(server, max_connections=1, **kwargs)
    return redis.Redis.from_url(server.url, **kwargs)


PATHS = ["one", "default"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("retries", [0, 2])
def test_a_connection_killed_while_waiting_for_the_reply_retries_as_the_policy_says(
    server: RedisServer, retries: int, path: str
) -> None:
    """The connection dies after the send: with retries, execute_command runs it again
    (and the script ran once); without, the ConnectionError is raised as before."""
    client = client_on(server, path, retry=Retry(NoBackoff(), retries))
    admin = redis.Redis.from_url(server.url)
    script = register(client, COUNTER)
    assert script(keys=("n",)) == 1
    admin.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")  # EVALSHA waits, KILL does not
    try:
        thread, outcome = call_in_thread(script, ("n",))
        wait_for(lambda: evalsha_postponed(admin), 10, "the EVALSHA to wait on the paused server")
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    thread.join(10)
    if retries:
        assert outcome == [2]  # the killed call never ran; the retried one did
    else:
        assert len(outcome) == 1 and isinstance(outcome[0], redis.ConnectionError)
        assert script(keys=("n",)) == 2


@pytest.mark.parametrize("path", PATHS)
def test_a_timeout_leaves_no_reply_behind_for_the_next_call(server: RedisServer, path: str) -> None:
    """With no retries, the timeout is raised; the slow script's reply, written once it
    ends, must not be read by the next call on that connection."""
    client = client_on(server, path, socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
    admin = redis.Redis.from_url(server.url)
    slow, echo = register(client, SLOW_COUNTER), register(client, ECHO)
    assert echo(args=("warm", 0)) == [b"warm", 0, b"text"]
    with pytest.raises(redis.TimeoutError):
        slow(keys=("n",), args=(600_000,))
    assert admin.get("n") == b"1"  # answered once the script has ended
    assert echo(args=("own", 5)) == [b"own", 5, b"text"]


def test_a_connection_the_server_closed_while_idle_is_replaced_before_the_send(
    server: RedisServer,
) -> None:
    """No retries: a connection found closed after the send would raise; the pool polls it
    at checkout, so a new one is opened and the call runs once."""
    client = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0))
    admin = redis.Redis.from_url(server.url)
    counter = register(client, COUNTER)
    assert counter(keys=("n",)) == 1
    admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert counter(keys=("n",)) == 2


@pytest.mark.timeout(60)
@FORKS_WITH_THREADS
def test_a_forked_child_calls_on_a_connection_of_its_own(server: RedisServer) -> None:
    client = redis.Redis.from_url(server.url)
    counter = register(client, COUNTER)
    assert counter(keys=("n",)) == 1

    def child() -> dict[str, Any]:
        return {"replies": [counter(keys=("n",)) for _ in range(3)]}

    assert run_in_child(child) == {"replies": [2, 3, 4]}
    assert counter(keys=("n",)) == 5  # the parent's connection was not read by the child


#: Returns what it was given: its keys, then its arguments (a script of known replies).
GIVEN = "return {KEYS, ARGV}"
NOTHING = "redis.call('SET', KEYS[1], ARGV[1]) return nil"


def evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0))


def test_joined_scripts_run_in_one_call_each_on_its_own_keys_and_arguments(
    server: RedisServer,
) -> None:
    client = redis.Redis.from_url(server.url)
    given, nothing = register(client, GIVEN), register(client, NOTHING)
    first = (given, [b"{t}a", b"{t}b"], ["x", 1])
    second = (nothing, [b"{t}c"], ["set"])
    script, keys, args = joined_call(first, second)
    before = evalsha_calls(client)
    reply = script(keys=keys, args=args)
    # Each script saw only its own: a key or argument taken from the other would show here.
    assert reply == [[[b"{t}a", b"{t}b"], [b"x", b"1"]], None]
    assert client.get("{t}c") == b"set"
    # Loaded on the first call (refused NOSCRIPT, then sent again), one call ever after.
    assert evalsha_calls(client) - before == 2
    script, keys, args = joined_call(second, first)
    assert joined(given, nothing) is joined(given, nothing)
    assert script(keys=keys, args=args) == [None, [[b"{t}a", b"{t}b"], [b"x", b"1"]]]
    client.script_flush()
    assert script(keys=keys, args=args)[1] == [[b"{t}a", b"{t}b"], [b"x", b"1"]]


def test_joined_scripts_split_many_keys_and_arguments_past_luas_stack_limit(
    server: RedisServer,
) -> None:
    """Lua's unpack stops at 8,000 values: a joined call of a lock of many names still gives
    each script exactly its own keys and arguments."""
    client = redis.Redis.from_url(server.url)
    given, nothing = register(client, GIVEN), register(client, NOTHING)
    many_keys = [f"{{t}}k{i}".encode() for i in range(9000)]
    many_args = [str(i).encode() for i in range(9000)]
    first = (given, many_keys, many_args)
    second = (nothing, [b"{t}c"], ["set"])
    script, keys, args = joined_call(first, second)
    assert script(keys=keys, args=args) == [[many_keys, many_args], None]
    assert client.get("{t}c") == b"set"
    script, keys, args = joined_call(second, first)
    assert script(keys=keys, args=args) == [None, [many_keys, many_args]]


def test_a_done_mark_rides_in_the_lease_acquire_and_release_calls(server: RedisServer) -> None:
    """A task run's acquire and release, each with its done mark: one script call apiece,
    not a pipeline of two."""
    from celery_singleton_lock import LockClient
    from celery_singleton_lock.celery import done_marks

    client = LockClient.from_url(server.url, prefix="csltest:joined:")
    try:
        connection = client.connection
        lease = client.lease("joined", ttl=10)
        mark = done_marks.DoneMark.of(connection, lease, "t-1", 0, 30.0)
        warm = client.lease("joined:warm", ttl=10)  # loads the scripts
        warm_mark = done_marks.DoneMark.of(connection, warm, "t-0", 0, 30.0)
        assert done_marks.acquire(connection, warm, 0.0, warm_mark) == (True, -1)
        done_marks.release(connection, warm, 0.0, warm_mark)
        redis_client = connection.redis
        before = evalsha_calls(redis_client)
        assert done_marks.acquire(connection, lease, 0.0, mark) == (True, -1)
        assert evalsha_calls(redis_client) - before == 1
        done_marks.release(connection, lease, 0.0, mark)
        assert evalsha_calls(redis_client) - before == 2
        assert done_marks.read_ended(connection, mark) == 0
        assert not lease.held and not client.holders("joined")
    finally:
        client.close()
