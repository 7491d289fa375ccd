"""Bad input raises ConfigurationError naming the argument, before any Redis call: to the
client and its locks, and to the admin and cleanup entry points."""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_singleton_lock import (
    AsyncLockClient,
    ConfigurationError,
    Lease,
    LockBackendError,
    LockClient,
    admin,
)
from celery_singleton_lock.core.heartbeat import heartbeat
from celery_singleton_lock.core.holder import flatten
from celery_singleton_lock.embedded import free_port
from celery_singleton_lock.kinds import multi, rangelock, rwlock, semaphore


@pytest.fixture
def dead_client() -> Iterator[LockClient]:
    """A client of a port where nothing listens: any Redis call raises LockBackendError,
    so a ConfigurationError from it proves the argument was checked first."""
    client = LockClient.from_url(f"redis://:pw@127.0.0.1:{free_port()}/0", prefix="dead:")
    yield client
    client.close()


def test_the_dead_client_really_fails_on_any_redis_call(dead_client: LockClient) -> None:
    with pytest.raises(LockBackendError):
        dead_client.lease("fine").acquire()
    with pytest.raises(LockBackendError):
        dead_client.ping()


NAN, INF = math.nan, math.inf
BAD_SECONDS = [0, -1, -0.5, NAN, INF, -INF, True, False, "1", None, 1e-9, [1], 1e300]
BAD_SECONDS += [10**400, -(10**400)]  # too big for a float

BAD_LEASE_ARGUMENTS: list[tuple[str, dict[str, Any]]] = [
    ("name", {"name": ""}),
    ("name", {"name": None}),
    ("name", {"name": b"bytes"}),
    ("name", {"name": 42}),
    *[("ttl", {"ttl": value}) for value in BAD_SECONDS],
    ("wait", {"wait": -1}),
    ("wait", {"wait": -INF}),
    ("wait", {"wait": NAN}),
    ("wait", {"wait": True}),
    ("wait", {"wait": "5"}),
    ("wait", {"wait": None}),
    ("max_hold", {"ttl": 10, "max_hold": 5}),
    ("max_hold", {"max_hold": 0}),
    ("max_hold", {"max_hold": NAN}),
    ("max_hold", {"max_hold": INF}),
    ("max_hold", {"max_hold": "60"}),
    ("max_hold", {"max_hold": 1e300}),
    ("heartbeat", {"heartbeat": 1}),
    ("heartbeat", {"heartbeat": None}),
    ("heartbeat", {"heartbeat": "yes"}),
    ("owner_info", {"owner_info": "task"}),
    ("owner_info", {"owner_info": ["task_name", "x"]}),
    ("owner_info", {"owner_info": {1: "x"}}),
    ("owner_info", {"owner_info": {"": "x"}}),
    ("owner_info", {"owner_info": {"task_name": None}}),
    ("owner_info", {"owner_info": {"task_name": True}}),
    ("owner_info", {"owner_info": {"task_name": ["x"]}}),
    ("owner_info", {"owner_info": {"task_name": "lone \ud800 surrogate"}}),
    ("owner_info", {"owner_info": {"bad \udfff key": "x"}}),
    ("on_lost", {"on_lost": "print"}),
    ("on_lost", {"on_lost": 1}),
]


@pytest.mark.parametrize(
    ("argument", "kwargs"),
    BAD_LEASE_ARGUMENTS,
    ids=[f"{argument}={list(kwargs.values())[-1]!r}" for argument, kwargs in BAD_LEASE_ARGUMENTS],
)
def test_bad_lease_argument(dead_client: LockClient, argument: str, kwargs: dict[str, Any]) -> None:
    kwargs = {"name": "job", **kwargs}
    name = kwargs.pop("name")
    with pytest.raises(ConfigurationError) as info:
        dead_client.lease(name, **kwargs)
    assert info.value.argument == argument
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("wait", [-1, -0.001, NAN, -INF, "1", True])
def test_bad_acquire_wait(dead_client: LockClient, wait: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        dead_client.lease("job").acquire(wait=wait)
    assert info.value.argument == "wait"


@pytest.mark.parametrize("ttl", [0, -1, NAN, INF, True, "1", 1e300])
def test_bad_extend_ttl(dead_client: LockClient, ttl: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        dead_client.lease("job").extend(ttl=ttl)
    assert info.value.argument == "ttl"


@pytest.mark.parametrize("delay", [-1, -0.001, NAN, INF, -INF, "1", True, None, 1e300])
def test_bad_release_delay(dead_client: LockClient, delay: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        dead_client.lease("job").release(delay=delay)
    assert info.value.argument == "delay"


@pytest.mark.parametrize("prefix", [None, 1, b"csl:", "a{b", "a}b", "{x}"])
def test_bad_prefix(prefix: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        LockClient.from_url(f"redis://127.0.0.1:{free_port()}/0", prefix=prefix)
    assert info.value.argument == "prefix"
    with pytest.raises(ConfigurationError) as info:
        LockClient(redis.Redis(port=free_port()), prefix=prefix)
    assert info.value.argument == "prefix"


def test_bad_prefix_is_refused_before_a_cluster_url_is_connected() -> None:
    # A Cluster client reads the slot map when it is made: the prefix is checked first, so
    # the error names it rather than the unreachable nodes.
    with pytest.raises(ConfigurationError) as info:
        LockClient.from_url(f"redis+cluster://127.0.0.1:{free_port()}", prefix="a{b")
    assert info.value.argument == "prefix"


@pytest.mark.parametrize(
    "url",
    [
        "",
        None,
        42,
        b"redis://localhost",
        "http://:hunter2@localhost:6379/0",
        "localhost:6379",
        "redis://:hunter2@localhost:notaport/0",
        "redis://:hunter2@[::1/0",
    ],
)
def test_bad_url(url: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        LockClient.from_url(url)
    assert info.value.argument == "url"
    assert "hunter2" not in str(info.value)


def test_not_a_redis_client() -> None:
    with pytest.raises(ConfigurationError) as info:
        LockClient(object())  # type: ignore[arg-type]
    assert info.value.argument == "redis_client"


@pytest.mark.parametrize(
    "make",
    [
        lambda: LockClient(redis.Redis(port=free_port(), decode_responses=True)),
        lambda: LockClient.from_url(f"redis://127.0.0.1:{free_port()}/0?decode_responses=True"),
        lambda: AsyncLockClient(redis.asyncio.Redis(port=free_port(), decode_responses=True)),
    ],
    ids=["sync", "url", "asyncio"],
)
def test_a_client_that_decodes_its_replies_is_refused_before_any_call(make: Any) -> None:
    """A lock hash keeps a binary field (the packed holder record): such a client could take
    locks but not list or clear them (UnicodeDecodeError). No server listens on the port:
    the refusal comes first."""
    with pytest.raises(ConfigurationError, match="decode_responses") as info:
        make()
    assert info.value.argument == "redis_client"


def test_largest_accepted_ttl_and_delay_work_on_the_real_server(lock_client: LockClient) -> None:
    """The upper bounds are ones Redis and the heartbeat accept: no half-written lock."""
    from celery_singleton_lock.core.validate import MAX_SECONDS

    lease = lock_client.lease("long", ttl=MAX_SECONDS, max_hold=MAX_SECONDS)
    assert lease.acquire()
    assert lock_client.redis.pttl(lease.keys.lock) > (MAX_SECONDS - 60) * 1000
    assert heartbeat().running
    lease.release(delay=MAX_SECONDS)
    assert lock_client.redis.pttl(lease.keys.lock) > (MAX_SECONDS - 60) * 1000
    assert lock_client.redis.hget(lease.keys.lock, "owner") == b""
    lock_client.redis.delete(lease.keys.lock)
    with pytest.raises(ConfigurationError):
        lock_client.lease("long", ttl=MAX_SECONDS * 1.01)


def test_owner_info_is_stored(lock_client: LockClient) -> None:
    lease = lock_client.lease(
        "info", owner_info={"task_name": "app.report", "task_id": "abc", "retries": 2, "x": 1.5}
    )
    assert lease.acquire()
    holder = flatten(lock_client.redis.hgetall(lease.keys.lock))
    assert holder[b"task_name"] == b"app.report"
    assert holder[b"task_id"] == b"abc"
    lease.release()


@pytest.mark.parametrize("size", [0, 31, 32, 255, 256, 65_535, 65_536])
def test_holder_fields_are_stored_byte_for_byte_whatever_their_length(
    lock_client: LockClient, size: int
) -> None:
    """The acquire script gets the holder's fields packed into one argument (a MessagePack
    array, whose string headers change at 32, 256 and 65,536 bytes): each field lands in
    the hash as the separate arguments used to store it."""
    name = "packed-\ud800-" + "n" * size
    value = ("é" * size)[: max(0, size - 1)] + "x" if size else ""
    lease = lock_client.lease(name, owner_info={"task_name": value, "worker": "w", "k": "v"})
    assert lease.acquire()
    stored = flatten(lock_client.redis.hgetall(lease.keys.lock))
    assert stored[b"name"] == name.encode("utf-8", "surrogatepass")
    assert stored[b"task_name"] == value.encode()
    assert stored[b"worker"] == b"w"
    assert stored[b"info"] == b'{"k": "v"}'
    assert stored[b"kind"] == b"lease"
    assert stored[b"pid"] == str(os.getpid()).encode()
    assert stored[b"thread"] == threading.current_thread().name.encode()
    assert stored[b"heartbeat"] == b"1"
    lease.release()


names = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=40),
    st.text(st.characters(exclude_categories=()), min_size=190, max_size=260),
    st.sampled_from(["\x00", "#", "{", "}", "{}", "#" + "0" * 40, "\ud800", "x" * 100_000]),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(first=names, second=names)
def test_any_name_works_or_is_refused_and_names_never_collide(
    lock_client: LockClient, first: str, second: str
) -> None:
    leases: list[Lease] = []
    try:
        for name in (first, second) if first != second else (first,):
            try:
                lease = lock_client.lease(name, heartbeat=False)
            except ConfigurationError as exc:
                assert exc.argument == "name"
                assert name == ""
                continue
            # Another name's lease, held, never blocks this one.
            assert lease.acquire(), (name, [held.name for held in leases])
            leases.append(lease)
            assert not lock_client.lease(name).acquire()
        for lease in leases:
            lease.release()
        for lease in leases:  # released: free again
            assert lock_client.lease(lease.name, heartbeat=False).acquire()
            lock_client.redis.delete(lease.keys.lock)
    finally:
        lock_client.redis.delete(*(lease.keys.lock for lease in leases), "unused")


# -- the admin and cleanup entry points check their arguments first ----------------------------

BAD_TOKENS = [1.5, 2.0, NAN, math.inf, True, False, "3", b"3", 0, -1, [1]]
BAD_TEXT = [None, "", 5, b"t-1", "\ud800"]
BAD_PIDS = [1.5, 12.0, NAN, True, "12", 0, -3, None]
BAD_DELAYS = [NAN, -1, "1", math.inf, True]

Call = Callable[[LockClient], object]


def bad_calls() -> Iterator[tuple[str, str, Call]]:
    """(test id, argument expected in the error, call) for every admin and cleanup entry."""
    ok = {"task_id": "t-1", "pid": 1234}
    for token in BAD_TOKENS:
        yield f"clear-token-{token!r}", "token", lambda c, t=token: c.clear("job", token=t)
        yield (
            f"admin.clear-token-{token!r}",
            "token",
            lambda c, t=token: admin.clear(c, "job", token=t, force=True),
        )
        for module in (rwlock, rangelock, multi, semaphore):
            yield (
                f"{module.__name__}.clear_holder-token-{token!r}",
                "token",
                lambda c, t=token, m=module: m.clear_holder(c, "job", "owner", token=t),
            )
    for name in (None, "", 3):
        yield f"clear-name-{name!r}", "name", lambda c, n=name: c.clear(n)
        yield f"admin.clear-name-{name!r}", "name", lambda c, n=name: admin.clear(c, n)
        yield f"release_holder-name-{name!r}", "name", lambda c, n=name: c.release_holder(n, **ok)
        for module in (rwlock, rangelock, multi, semaphore):
            yield (
                f"{module.__name__}.clear_holder-name-{name!r}",
                "name",
                lambda c, n=name, m=module: m.clear_holder(c, n, "owner"),
            )
    for force in ("yes", 1, None):
        yield f"clear-force-{force!r}", "force", lambda c, f=force: c.clear("job", force=f)
    for pattern in (3, b"job*", ["job"]):
        yield f"locks-pattern-{pattern!r}", "pattern", lambda c, p=pattern: c.locks(p)
    for owner in BAD_TEXT:
        for module in (rwlock, rangelock, multi, semaphore):
            yield (
                f"{module.__name__}.clear_holder-owner-{owner!r}",
                "owner",
                lambda c, o=owner, m=module: m.clear_holder(c, "job", o),
            )
    releases: list[tuple[str, Callable[..., object]]] = [
        ("client.release_holder", lambda c, **kw: c.release_holder("job", **kw)),
        ("rwlock.release_holder", lambda c, **kw: rwlock.release_holder(c, "job", **kw)),
        ("rangelock.release_holder", lambda c, **kw: rangelock.release_holder(c, "job", **kw)),
        ("multi.release_holder", lambda c, **kw: multi.release_holder(c, ["job", "b"], **kw)),
        ("semaphore.release_holder", lambda c, **kw: semaphore.release_holder(c, "job", **kw)),
    ]
    for label, release in releases:
        bad: list[tuple[str, object]] = [("task_id", v) for v in BAD_TEXT]
        bad += [("pid", v) for v in BAD_PIDS]
        bad += [("host", v) for v in ("", 5, b"host")]
        bad += [("delay", v) for v in BAD_DELAYS]
        for argument, value in bad:
            yield (
                f"{label}-{argument}-{value!r}",
                argument,
                lambda c, r=release, a=argument, v=value: r(c, **{**ok, a: v}),
            )
    for names in ("job", [], ["job", 3], None):
        yield (
            f"multi.release_holder-names-{names!r}",
            "names",
            lambda c, n=names: multi.release_holder(c, n, **ok),
        )


BAD_CALLS = list(bad_calls())


@pytest.mark.parametrize(
    ("argument", "call"), [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
def test_admin_and_cleanup_entry_points_reject_bad_input_before_any_redis_call(
    dead_client: LockClient, argument: str, call: Call
) -> None:
    with pytest.raises(ConfigurationError) as error:
        call(dead_client)
    assert error.value.argument == argument


def test_the_admin_and_cleanup_entry_points_reach_for_redis_with_good_arguments(
    dead_client: LockClient,
) -> None:
    """The counterpart: the same entry points with good arguments do reach for Redis."""
    calls: list[Call] = [
        lambda c: c.clear("job", token=3, force=True),
        lambda c: c.locks("job*"),
        lambda c: c.release_holder("job", task_id="t-1", pid=1234, host="h", delay=1),
        lambda c: rwlock.clear_holder(c, "job", "owner", token=3),
        lambda c: rangelock.release_holder(c, "job", task_id="t-1", pid=1234),
        lambda c: multi.clear_holder(c, "job", "owner", token=3),
    ]
    for call in calls:
        with pytest.raises(LockBackendError):
            call(dead_client)


def test_a_fractional_token_is_refused_not_truncated(lock_client: LockClient) -> None:
    """``token=1.5`` is no token: it never clears the holder with token 1."""
    hold = lock_client.rwlock("job").write(ttl=60.0)
    assert hold.acquire() and hold.token is not None and hold.owner is not None
    with pytest.raises(ConfigurationError):
        rwlock.clear_holder(lock_client, "job", hold.owner, token=hold.token + 0.5)
    assert hold.held
    heartbeat().tick()
    assert hold.held and not hold.lost
    assert rwlock.clear_holder(lock_client, "job", hold.owner, token=hold.token)
