"""AsyncLockClient: bad input raises ConfigurationError naming the argument, before any Redis
call (the same checks and the same bad values as the sync client)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio
from support.async_sides import run
from test_lease_arguments import BAD_DELAYS, BAD_LEASE_ARGUMENTS, BAD_PIDS, BAD_TEXT

from celery_singleton_lock import AsyncLockClient, ConfigurationError, LockBackendError
from celery_singleton_lock.embedded import free_port

NAN, INF = math.nan, math.inf


def dead_client() -> AsyncLockClient:
    """A client of a port where nothing listens: any Redis call raises LockBackendError, so
    a ConfigurationError from it proves the argument was checked first."""
    return AsyncLockClient.from_url(f"redis://:pw@127.0.0.1:{free_port()}/0", prefix="dead:")


def refused(call: Callable[[AsyncLockClient], Awaitable[Any] | Any]) -> ConfigurationError:
    """The ConfigurationError ``call(dead client)`` raises (awaited if it is a coroutine)."""

    async def body() -> ConfigurationError:
        client = dead_client()
        try:
            with pytest.raises(ConfigurationError) as info:
                result = call(client)
                if isinstance(result, Awaitable):
                    await result
            return info.value
        finally:
            await client.close()

    return run(body())


def test_the_dead_client_really_fails_on_any_redis_call() -> None:
    async def body() -> None:
        client = dead_client()
        with pytest.raises(LockBackendError) as info:
            await client.lease("fine").acquire()
        assert "pw" not in str(info.value)
        with pytest.raises(LockBackendError):
            await client.ping()
        with pytest.raises(LockBackendError):
            await client.locks()
        await client.close()

    run(body())


@pytest.mark.parametrize(
    ("argument", "kwargs"),
    BAD_LEASE_ARGUMENTS,
    ids=[f"{argument}={list(kwargs.values())[-1]!r}" for argument, kwargs in BAD_LEASE_ARGUMENTS],
)
def test_bad_lease_argument(argument: str, kwargs: dict[str, Any]) -> None:
    kwargs = {"name": "job", **kwargs}
    name = kwargs.pop("name")
    error = refused(lambda client: client.lease(name, **kwargs))
    assert error.argument == argument
    assert isinstance(error, ValueError)
    # The other kinds take the same options.
    options = dict(kwargs)
    if argument != "name":
        assert refused(lambda c: c.rwlock("x").write(**options)).argument == argument
        assert refused(lambda c: c.range_lock("x").read(0, 1, **options)).argument == argument
        assert refused(lambda c: c.multi(["x", "y"], **options)).argument == argument


@pytest.mark.parametrize("wait", [-1, -0.001, NAN, -INF, "1", True])
def test_bad_acquire_and_upgrade_wait(wait: Any) -> None:
    assert refused(lambda c: c.lease("job").acquire(wait=wait)).argument == "wait"


@pytest.mark.parametrize("ttl", [0, -1, NAN, INF, True, "1", 1e300])
def test_bad_extend_ttl(ttl: Any) -> None:
    assert refused(lambda c: c.lease("job").extend(ttl=ttl)).argument == "ttl"


@pytest.mark.parametrize("delay", [-1, -0.001, NAN, INF, -INF, "1", True, None, 1e300])
def test_bad_release_delay(delay: Any) -> None:
    assert refused(lambda c: c.lease("job").release(delay=delay)).argument == "delay"


@pytest.mark.parametrize(
    ("argument", "call"),
    [
        ("name", lambda c: c.rwlock("")),
        ("name", lambda c: c.range_lock(None)),
        ("lo", lambda c: c.range_lock("r").read(2, 1)),
        ("lo", lambda c: c.range_lock("r").write(NAN, 1)),
        ("hi", lambda c: c.range_lock("r").upgradable(0, "9")),
        ("names", lambda c: c.multi([])),
        ("names", lambda c: c.multi("ab")),
        ("names", lambda c: c.multi(["a", ""])),
        ("name", lambda c: c.clear("")),
        ("token", lambda c: c.clear("x", token="1")),
        ("token", lambda c: c.clear("x", token=0)),  # tokens start at 1, as for LockClient
        ("force", lambda c: c.clear("x", force="yes")),
        ("pattern", lambda c: c.locks(42)),
    ],
)
def test_bad_lock_and_admin_arguments(argument: str, call: Any) -> None:
    assert refused(call).argument == argument


@pytest.mark.parametrize("prefix", [None, 1, b"csl:", "a{b", "a}b", "{x}"])
def test_bad_prefix(prefix: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        AsyncLockClient.from_url(f"redis://127.0.0.1:{free_port()}/0", prefix=prefix)
    assert info.value.argument == "prefix"
    with pytest.raises(ConfigurationError) as info:
        AsyncLockClient(redis.asyncio.Redis(port=free_port()), prefix=prefix)
    assert info.value.argument == "prefix"


@pytest.mark.parametrize(
    "url",
    [
        "",
        None,
        42,
        "http://:hunter2@localhost:6379/0",
        "localhost:6379",
        "redis+cluster://:hunter2@localhost:7000/3",  # a Cluster has database 0 only
        "sentinel://:hunter2@localhost:26379",  # no master name
    ],
)
def test_bad_or_unsupported_url(url: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        AsyncLockClient.from_url(url)
    assert info.value.argument == "url"
    assert "hunter2" not in str(info.value)


def test_a_sync_redis_client_is_refused() -> None:
    for wrong in (object(), redis.Redis(port=free_port())):
        with pytest.raises(ConfigurationError) as info:
            AsyncLockClient(wrong)
        assert info.value.argument == "redis_client"


def bad_release_holder_arguments() -> list[tuple[str, Any]]:
    bad: list[tuple[str, Any]] = [("task_id", v) for v in BAD_TEXT]
    bad += [("pid", v) for v in BAD_PIDS]
    bad += [("host", v) for v in ("", 5, b"host")]
    return bad + [("delay", v) for v in BAD_DELAYS]


@pytest.mark.parametrize(("argument", "value"), bad_release_holder_arguments())
def test_bad_release_holder_argument(argument: str, value: Any) -> None:
    """Checked as the sync client's release_holder checks them (test_lease_arguments.py)."""
    good: dict[str, Any] = {"task_id": "t-1", "pid": 1234}
    kwargs = {**good, argument: value}
    assert refused(lambda c: c.release_holder("job", **kwargs)).argument == argument
