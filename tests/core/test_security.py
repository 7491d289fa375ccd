"""Secrets and hostile input: passwords stay out of logs, errors, reprs and the admin
command; the key prefix isolates apps sharing one Redis; no lock name, task argument, option
value or range bound can escape the prefix, break a script or touch another lock.

The fuzzing runs on a private ``redis-server``, so every key on it can be checked: after
each example all keys are under a known prefix and all of them expire, and a sentinel lease
and a sentinel range hold, taken before the fuzzing and held throughout, are unchanged.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
import redis
from celery import Celery
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_singleton_lock import (
    ConfigurationError,
    LockBackendError,
    LockClient,
    LockLost,
    SingletonTask,
)
from celery_singleton_lock.celery.app_client import close_lock_client
from celery_singleton_lock.celery.options import (
    TASK_OPTIONS,
    AppSettings,
    TaskLockOptions,
    check_task_options,
)
from celery_singleton_lock.celery.task import lock_client_for
from celery_singleton_lock.cli.commands import Session
from celery_singleton_lock.core.heartbeat import heartbeat
from celery_singleton_lock.core.holder import flatten
from celery_singleton_lock.core.keys import encode_name, lock_keys
from celery_singleton_lock.embedded import RedisServer
from celery_singleton_lock.kinds.intervals import interval_keys

PASSWORD = "pw-" + uuid.uuid4().hex
PREFIX = "sec:"
OTHER_PREFIX = "sec-other:"
#: Examples per fuzzing test (docs/reliability.md quotes these).
FUZZ_EXAMPLES = 200
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# -- passwords ----------------------------------------------------------------------------------


class Capture(logging.Handler):
    """Every log record of every logger, formatted with its traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.formatter_ = logging.Formatter("%(name)s %(levelname)s %(message)s")
        self.lines: list[str] = []
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        text = self.formatter_.format(record) + " " + repr(record.args)
        with self._guard:
            self.lines.append(text)


@pytest.fixture
def all_logs() -> Iterator[Capture]:
    root = logging.getLogger()
    capture = Capture()
    level = root.level
    root.addHandler(capture)
    root.setLevel(logging.DEBUG)
    try:
        yield capture
    finally:
        root.removeHandler(capture)
        root.setLevel(level)


def error_text(error: BaseException) -> str:
    """Everything an error shows: message, repr, chained causes and the traceback."""
    return " ".join(
        [str(error), repr(error), *traceback.format_exception(type(error), error, None)]
    )


def admin(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery_singleton_lock", "--url", url, "--prefix", PREFIX, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "REDIS_URL"},
    )


def wait_until(probe: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.timeout(90)
def test_password_never_appears_in_logs_errors_reprs_or_the_admin_command(
    all_logs: Capture,
) -> None:
    with RedisServer(password=PASSWORD) as server:
        assert PASSWORD in server.url
        client = LockClient.from_url(server.url, prefix=PREFIX)
        lost = threading.Event()
        lease = client.lease("held", ttl=1.0, on_lost=lambda _: lost.set())
        assert lease.acquire()
        reader = client.rwlock("rw").read(ttl=1.0)
        assert reader.acquire()
        ranged = client.range_lock("range").write(0, 10, ttl=1.0)
        assert ranged.acquire()
        multi = client.multi(["m1", "m2"], ttl=1.0)
        assert multi.acquire()

        listed = admin(server.url, "list")
        shown = admin(server.url, "show", "held", "--json")
        as_json = admin(server.url, "list", "--json")
        assert listed.returncode == 0 and "held" in listed.stdout, listed
        assert shown.returncode == 0 and "held" in shown.stdout, shown
        assert json.loads(as_json.stdout)

        # A waiter blocked on the held lease when the server dies: it rides the outage out
        # within its wait, then says Redis did not answer.
        waiter_errors: list[BaseException] = []
        subscribed = threading.Event()

        def wait() -> None:
            subscribed.set()
            try:
                client.lease("held").acquire(wait=2)
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                waiter_errors.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        subscribed.wait(5)
        channel = lock_keys(PREFIX, "held").channel
        wait_until(
            lambda: dict(client.redis.pubsub_numsub(channel)).get(channel, 0) >= 1,
            10,
            "the waiter to subscribe",
        )
        server.stop()
        thread.join(15)
        assert not thread.is_alive()
        assert lost.wait(10), "the heartbeat never gave the lease up"

        errors: list[BaseException] = list(waiter_errors)
        calls = [
            client.ping,
            lambda: client.lease("x").acquire(),
            lambda: client.locks(),
            lambda: client.clear("held", force=True),
            lease.check,
        ]
        for call in calls:
            with pytest.raises((LockBackendError, LockLost)) as info:
                call()
            errors.append(info.value)
        assert any(isinstance(e, LockBackendError) for e in errors)
        for error in errors:
            assert PASSWORD not in error_text(error)

        # A task on a password URL: "run" logs a WARNING with the error; "fail" fails the run.
        app = Celery("sec-app", set_as_current=False)
        app.conf.update(
            singleton_lock_url=server.url, singleton_lock_prefix=PREFIX, task_always_eager=True
        )

        @app.task(base=SingletonTask, shared=False, name="sec.run", lock_backend_down="run")
        def unlocked() -> str:
            return "ran"

        @app.task(base=SingletonTask, shared=False, name="sec.fail")
        def failing() -> str:
            return "ran"

        assert unlocked.apply().get() == "ran"
        failed = failing.apply()
        assert isinstance(failed.result, LockBackendError)
        assert PASSWORD not in error_text(failed.result) + str(failed.traceback)
        assert any("UNLOCKED" in line for line in all_logs.lines)
        settings_ = AppSettings.from_conf(app.conf)
        down = admin(server.url, "list")
        wrong = admin(server.url.replace(PASSWORD, PASSWORD + "-wrong"), "list")

        server.start()
        wrong_up = admin(server.url.replace(PASSWORD, "not-" + PASSWORD), "list")
        bad = LockClient.from_url(server.url.replace(PASSWORD, "nope-" + PASSWORD), prefix="x:")
        with pytest.raises(LockBackendError) as info:
            bad.ping()
        errors.append(info.value)
        assert "nope-" + PASSWORD not in error_text(info.value)
        bad.close()

        assert down.returncode == 2 and f"127.0.0.1:{server.port}" in down.stderr, down
        assert wrong.returncode == 2 and wrong_up.returncode == 2, (wrong, wrong_up)
        for run in (listed, shown, as_json, down, wrong, wrong_up):
            assert PASSWORD not in run.stdout + run.stderr, run
        reprs = [
            repr(client), repr(lease), repr(reader), repr(ranged), repr(multi), client.url,
            repr(client.rwlock("rw")), repr(client.range_lock("range")), repr(settings_),
            repr(failing.lock_client),
            repr(Session(url=server.url, prefix=PREFIX)),
        ]  # fmt: skip
        for text in reprs:
            assert PASSWORD not in text, text
        for handle in (reader, ranged, multi):
            heartbeat().remove(handle)
        client.close()
        failing.lock_client.close()

    assert any("celery_singleton_lock" in line for line in all_logs.lines)
    assert any("unreachable" in line or "could not reach" in line for line in all_logs.lines)
    leaked = [line for line in all_logs.lines if PASSWORD in line]
    assert leaked == []


# -- the shared fuzzing server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as private:
        yield private


@pytest.fixture(scope="module")
def client(server: RedisServer) -> Iterator[LockClient]:
    client = LockClient.from_url(server.url, prefix=PREFIX)
    yield client
    client.close()


@pytest.fixture(scope="module")
def other(server: RedisServer) -> Iterator[LockClient]:
    """Another app on the same server."""
    client = LockClient.from_url(server.url, prefix=OTHER_PREFIX)
    yield client
    client.close()


SENTINEL = "sentinel-" + uuid.uuid4().hex[:8]


class Sentinels:
    """A lease and a range hold held throughout; ``check()`` asserts nothing changed them
    (the heartbeat's renewal time and expiry aside)."""

    def __init__(self, client: LockClient, other: LockClient) -> None:
        self.redis = client.redis
        self.lease = client.lease(SENTINEL, ttl=30)
        self.other_lease = other.lease(SENTINEL, ttl=30)
        self.range = client.range_lock(SENTINEL).write(0, 10, ttl=30)
        for handle in (self.lease, self.other_lease, self.range):
            assert handle.acquire()
        self.snapshot = self._state()

    def _state(self) -> dict[str, Any]:
        keys = interval_keys(PREFIX, SENTINEL, b"range")
        holder = keys.holder(self.range.owner or "")
        state: dict[str, Any] = {}
        for key in (
            lock_keys(PREFIX, SENTINEL).lock,
            lock_keys(OTHER_PREFIX, SENTINEL).lock,
            holder,
        ):
            fields = self.redis.hgetall(key)
            fields.pop(b"renewed_ms", None)
            state[key.decode()] = fields
        for index in keys.indexes[1:]:
            state[index.decode()] = self.redis.zrange(index, 0, -1, withscores=True)
        return state

    def check(self) -> None:
        for handle in (self.lease, self.other_lease, self.range):
            handle.check()
        assert self._state() == self.snapshot

    def release(self) -> None:
        for handle in (self.lease, self.other_lease, self.range):
            handle.release()


@pytest.fixture(scope="module")
def sentinels(client: LockClient, other: LockClient) -> Iterator[Sentinels]:
    held = Sentinels(client, other)
    yield held
    held.check()
    held.release()


def assert_confined(redis_client: Any) -> None:
    """Every key on the server is under a known prefix and expires, the prefixes' key layout
    records (core/layout.py) included."""
    for key in redis_client.scan_iter(count=1000):
        assert key.startswith((PREFIX.encode(), OTHER_PREFIX.encode())), key
        # -1 is a key with no expiry. A key found by the scan may expire before its PTTL is
        # read (a 1 ms release delay): 0 and -2 (gone) are what a short expiry looks like.
        assert redis_client.pttl(key) != -1, key


# -- prefixes -----------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("first", "second"),
    [("app1:", "app2:"), ("a", "a:"), ("a*", "ab"), ("a?", "a["), ("", "x"), ("p\\", "p")],
)
def test_apps_with_different_prefixes_never_block_or_see_each_other(
    restartable_redis: RedisServer, first: str, second: str
) -> None:
    one = LockClient.from_url(restartable_redis.url, prefix=first)
    two = LockClient.from_url(restartable_redis.url, prefix=second)
    held: list[list[Any]] = []
    try:
        for client in (one, two):
            handles = [
                client.lease("job", ttl=30),
                client.rwlock("rw").write(ttl=30),
                client.range_lock("range").write(-math.inf, math.inf, ttl=30),
                client.multi(["m1", "m2"], ttl=30),
            ]
            held.append(handles)
            for handle in handles:
                assert handle.acquire(), (client.prefix, handle)
        for client in (one, two):
            names = sorted(info.name for info in client.locks())
            assert names == ["job", "m1", "m2", "range", "rw"], (client.prefix, names)
        # Clearing everything in one app leaves the other's locks alone.
        for name in ("job", "rw", "range", "m1"):
            assert one.clear(name, force=True)
        assert sorted(info.name for info in one.locks()) == ["m2"]
        for handle in held[1]:
            handle.check()
            handle.extend()
        assert sorted(info.name for info in two.locks()) == ["job", "m1", "m2", "range", "rw"]
        for handle in held[1]:
            handle.release()
    finally:
        for handle in (handle for handles in held for handle in handles):
            heartbeat().remove(handle)
        for client in (one, two):
            client.close()


def test_a_prefix_cannot_carry_hash_tag_braces(server: RedisServer) -> None:
    for prefix in ("a{", "}b", "{x}:"):
        with pytest.raises(ConfigurationError) as info:
            LockClient.from_url(server.url, prefix=prefix)
        assert info.value.argument == "prefix"
    with pytest.raises(ConfigurationError):
        LockClient(redis.Redis(port=server.port), prefix=b"bytes:")  # type: ignore[arg-type]


# -- names --------------------------------------------------------------------------------------

HOSTILE_NAMES = [
    "{", "}", "{}", "{job}", "}:lock", "job}:lock", "a{b}c", "*", "?", "[a-z]", "\\", "\n",
    "a\r\nFLUSHALL\r\n", "\x00", "a\x00b", "#", "#" + "0" * 40, " ", "\t",
    "') redis.call('FLUSHALL') --", "]]..redis.call('DEL', KEYS[1])..[[",
    "return redis.call('FLUSHALL')", "%s%d%n", "\\x00", "ARGV[1]", "KEYS[1]",
    "\ud800", "a\udfffb", "\U0010ffff", "é" * 150, "x" * 201, "x" * 1_000_000,
    SENTINEL + "\x00", SENTINEL + "}", "{" + SENTINEL + "}",
]  # fmt: skip

names = st.one_of(
    st.sampled_from(HOSTILE_NAMES),
    st.text(),
    st.text(alphabet=st.characters(codec=None, categories=["Cs", "Cc", "Zs", "So", "Lo"])),
    st.lists(
        st.sampled_from(["{", "}", "*", "\n", "\x00", "#", "?", "[", "\\", ":lock", "redis.call"])
    ).map("".join),
    st.builds(lambda text, n: text * n, st.text(min_size=1, max_size=3), st.integers(60, 20_000)),
    st.binary(max_size=8),
    st.integers(),
    st.none(),
)


def exercise_name(client: LockClient, other: LockClient, name: Any) -> str:
    """Take every kind of lock on ``name`` and check it holds exactly that name."""
    if not isinstance(name, str) or not name:
        for make in (client.lease, client.rwlock, client.range_lock):
            with pytest.raises(ConfigurationError):
                make(name)
        return "rejected"
    lease = client.lease(name, ttl=30, heartbeat=False)
    assert lease.acquire()
    keys = lock_keys(PREFIX, name)
    fields = flatten(client.redis.hgetall(keys.lock))
    assert fields[b"name"] == encode_name(name) and fields[b"owner"].decode() == lease.owner
    assert fields[b"token"].decode() == str(lease.token)
    assert not client.lease(name).acquire(0)  # the same name is taken...
    twin = other.lease(name, heartbeat=False)
    assert twin.acquire()  # ...but not in another app
    twin.release()
    listed = [info.name for info in client.locks() if info.kind == "lease"]
    assert name in listed
    lease.release()
    assert not client.redis.exists(keys.lock)

    handles = [
        client.rwlock(name).write(ttl=30, heartbeat=False),
        client.range_lock(name).write(-1, 1, ttl=30, heartbeat=False),
        client.multi([name, name + "\x00b"], ttl=30, heartbeat=False),
    ]
    for handle in handles:
        assert handle.acquire(), handle
    assert not client.lease(name).acquire(0)  # held by the multi-lock
    neighbour = client.lease(name + "\x00c", heartbeat=False)
    assert neighbour.acquire()
    for handle in [*handles, neighbour]:
        handle.release()
    return "ok"


@pytest.mark.timeout(120)
@FUZZ
@given(name=names)
def test_fuzzed_names_lock_exactly_themselves(
    client: LockClient, other: LockClient, sentinels: Sentinels, name: Any
) -> None:
    if name == SENTINEL:
        return
    try:
        exercise_name(client, other, name)
    finally:
        for leftover in client.locks():  # so that a failing example does not spoil the next
            if leftover.name != SENTINEL:
                client.clear(leftover.name, force=True)
    sentinels.check()
    assert_confined(client.redis)


def test_empty_and_non_str_names_are_configuration_errors(client: LockClient) -> None:
    for bad in ("", b"job", 1, None, ["a"]):
        for make in (client.lease, client.rwlock, client.range_lock):
            with pytest.raises(ConfigurationError):
                make(bad)
    for bad_names in ([], "ab", [""], ["a", 1], None):
        with pytest.raises(ConfigurationError):
            client.multi(bad_names)


# -- task arguments -----------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
any_values = st.one_of(
    json_values,
    st.floats(),
    st.binary(max_size=8),
    st.tuples(json_values, json_values),
    st.sets(st.integers(), max_size=4),
    st.dictionaries(st.integers(), json_values, max_size=3),
    st.decimals(),
    st.builds(object),
    st.integers(min_value=10**300),
)


@pytest.fixture(scope="module")
def task_app(server: RedisServer) -> Iterator[Celery]:
    app = Celery("sec-tasks", set_as_current=False)
    app.conf.update(
        singleton_lock_url=server.url, singleton_lock_prefix=PREFIX, task_always_eager=True
    )

    @app.task(base=SingletonTask, bind=True, shared=False, name="fz.default")
    def default(self: Any, a: Any, b: Any = None) -> int:
        self.lock.check()
        return int(self.lock.token)

    @app.task(base=SingletonTask, bind=True, shared=False, name="fz.template", lock_key="t:{a}")
    def template(self: Any, a: Any, b: Any = None) -> int:
        return int(self.lock.token)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="fz.multi",
        lock_keys=["acc:{a}", "acc:{b}"],
    )  # fmt: skip
    def multi(self: Any, a: Any, b: Any = None) -> int:
        return int(self.lock.token)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="fz.range",
        lock_key="r", lock_range=("a", "b"),
    )  # fmt: skip
    def ranged(self: Any, a: Any, b: Any = None) -> int:
        return int(self.lock.token)

    app.finalize()
    yield app
    close_lock_client(app)


@pytest.mark.timeout(120)
@FUZZ
@given(
    task=st.sampled_from(["fz.default", "fz.template", "fz.multi", "fz.range"]),
    a=any_values,
    b=any_values,
)
def test_fuzzed_task_arguments_name_a_lock_or_raise_configuration_error(
    task_app: Celery, client: LockClient, sentinels: Sentinels, task: str, a: Any, b: Any
) -> None:
    singleton = task_app.tasks[task]
    try:
        name: str | None = singleton.lock_name((a,), {"b": b})
    except ConfigurationError:
        name = None
    result = singleton.apply(args=(a,), kwargs={"b": b})
    if isinstance(result.result, ConfigurationError):
        return  # refused before any Redis call (a range bound that is not a number, ...)
    assert name is not None, result.result
    assert result.successful(), result.traceback
    assert isinstance(result.result, int) and not isinstance(result.result, bool), result.result
    assert isinstance(name, str) and name
    try:
        round_trip = json.loads(json.dumps([a, b], allow_nan=False))
    except (TypeError, ValueError):
        round_trip = None
    if round_trip is not None and round_trip == [a, b]:
        # What a JSON serializer hands the worker names the same lock.
        assert singleton.lock_name((round_trip[0],), {"b": round_trip[1]}) == name
    assert all(info.name == SENTINEL for info in singleton.lock_client.locks())
    sentinels.check()
    assert_confined(client.redis)


# -- option values ------------------------------------------------------------------------------

option_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**300),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["skip", "retry", "raise", "fail", "run", "read", "write", "upgradable"]),
    st.binary(max_size=4),
    st.lists(st.text(max_size=6), max_size=3),
    st.tuples(st.text(max_size=4), st.text(max_size=4)),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.decimals(),
    st.fractions(),
    st.complex_numbers(),
    st.just(lambda args, kwargs: "k"),
    st.builds(object),
)
option_names = st.sampled_from(
    [*TASK_OPTIONS, "lock_", "lock_TTL", "lock_timeout", "lock_keyz", "lock_\x00"]
)


class FakeTask:
    """Enough of a task for TaskLockOptions.resolve (static attribute lookup)."""


@pytest.mark.timeout(120)
@FUZZ
@given(
    options=st.dictionaries(option_names, option_values, max_size=4),
    conf=st.dictionaries(option_names.map(lambda o: "singleton_" + o), option_values, max_size=3),
)
def test_fuzzed_task_options_are_accepted_or_configuration_errors(
    client: LockClient, sentinels: Sentinels, options: dict[str, Any], conf: dict[str, Any]
) -> None:
    try:
        check_task_options("fz.task", options)
    except ConfigurationError as exc:
        assert exc.argument.startswith("fz.task.lock_")
        return
    task = FakeTask()
    for option, value in options.items():
        setattr(task, option, value)
    try:
        resolved = TaskLockOptions.resolve("fz.task", task, conf)
    except ConfigurationError:
        return
    # Whatever was accepted makes a lock that works and expires.
    lease = client.lease(
        "opt-" + uuid.uuid4().hex, ttl=resolved.lease, max_hold=resolved.max_hold, heartbeat=False
    )
    assert lease.acquire(min(resolved.wait, 0.0))
    lease.release(delay=min(resolved.release_delay, 60.0))
    sentinels.check()
    assert_confined(client.redis)


@pytest.mark.timeout(60)
def test_bad_options_are_refused_before_the_task_sends_anything(task_app: Celery) -> None:
    for index, (option, value) in enumerate([
        ("lock_ttl", math.nan), ("lock_ttl", 10**400), ("lock_lease", -1), ("lock_wait", "5"),
        ("lock_conflict", ["skip"]), ("lock_mode", "exclusive\x00"), ("lock_range", ("a",)),
        ("lock_keys", "acc:{a}"), ("lock_backend_down", "ignore"), ("lock_on_enqueue", 1),
        ("lock_release_delay", math.inf), ("lock_tll", 5),
    ]):  # fmt: skip
        # A name of its own each: two tasks of one name in one app collide (a Celery warning).
        with pytest.raises(ConfigurationError) as info:

            @task_app.task(
                base=SingletonTask, shared=False, name=f"bad.{index}.{option}", **{option: value}
            )
            def bad() -> None: ...

            # The class @app.task makes keeps its error for the first use (and a worker's
            # start): see SingletonTask.__init_subclass__.
            bad.delay()

        assert option in info.value.argument


# -- range bounds -------------------------------------------------------------------------------

bounds = st.one_of(
    st.floats(),
    st.integers(),
    st.integers(min_value=2**1000),
    st.sampled_from([math.inf, -math.inf, math.nan, 5e-324, -0.0, 1.7976931348623157e308]),
    st.just(10**400),
    st.text(max_size=6),
    st.sampled_from(["1", "inf", "(1", "-inf", "1 2", "nan"]),
    st.none(),
    st.booleans(),
    st.decimals(),
    st.fractions(),
)


def acceptable(lo: Any, hi: Any) -> bool:
    """Real numbers (ints and floats, not bools), neither NaN nor beyond a double, lo <= hi."""
    try:
        low, high = (float(v) for v in (lo, hi) if type(v) in (int, float))
    except (OverflowError, ValueError):
        return False
    return not math.isnan(low) and not math.isnan(high) and low <= high


@pytest.mark.timeout(120)
@FUZZ
@given(lo=bounds, hi=bounds)
def test_fuzzed_range_bounds_lock_exactly_that_range_or_raise_configuration_error(
    client: LockClient, sentinels: Sentinels, lo: Any, hi: Any
) -> None:
    ranges = client.range_lock("fuzzed-range")
    try:
        hold = ranges.write(lo, hi, ttl=30, heartbeat=False)
    except ConfigurationError:
        assert not acceptable(lo, hi), (lo, hi)
        return
    assert acceptable(lo, hi), (lo, hi)
    assert isinstance(lo, (int, float)) and isinstance(hi, (int, float))
    assert (hold.lo, hold.hi) == (float(lo), float(hi))
    assert hold.acquire()
    try:
        stored = client.redis.hgetall(
            interval_keys(PREFIX, "fuzzed-range", b"range").holder(hold.owner or "")
        )
        assert (float(stored[b"lo"]), float(stored[b"hi"])) == (float(lo), float(hi))
        # Exactly [lo, hi] is locked: both ends, and nothing beyond them.
        for point in (hold.lo, hold.hi):
            assert not ranges.read(point, point).acquire(0), point
        for point in (math.nextafter(hold.lo, -math.inf), math.nextafter(hold.hi, math.inf)):
            if math.isinf(point):
                continue
            probe = ranges.read(point, point, heartbeat=False)
            assert probe.acquire(0), (point, hold)
            probe.release()
    finally:
        hold.release()
    probe = ranges.write(-math.inf, math.inf, heartbeat=False)
    assert probe.acquire(0)
    probe.release()
    sentinels.check()
    assert_confined(client.redis)


def test_decimal_and_fraction_bounds_are_configuration_errors(client: LockClient) -> None:
    for lo, hi in [(Decimal(1), 2), (Fraction(1, 2), 1), (1, "2"), (math.nan, 1), (2, 1)]:
        with pytest.raises(ConfigurationError):
            client.range_lock("r").write(lo, hi)


def test_an_app_with_the_empty_prefix_gets_no_prefix(lock_redis_url: str) -> None:
    """``singleton_lock_prefix=""`` means what it says, like ``LockClient(prefix="")``: not
    the default ``csl:``, whose keys every app left at the default shares."""
    app = Celery("sec-empty-prefix", set_as_current=False)
    app.conf.update(singleton_lock_url=lock_redis_url, singleton_lock_prefix="")
    default_app = Celery("sec-default-prefix", set_as_current=False)
    default_app.conf.update(singleton_lock_url=lock_redis_url)

    @app.task(base=SingletonTask, name="sec.empty_prefix", lock_key="sec-{n}", shared=False)
    def job(n: str) -> str:
        return n

    client, default = job.lock_client, lock_client_for(default_app)
    try:
        assert client.prefix == "" and default.prefix == "csl:"
        lock = job.make_lock((uuid.uuid4().hex,))
        assert lock.acquire()
        assert client.redis.exists(lock_keys("", lock.name).lock)
        assert not client.redis.exists(lock_keys("csl:", lock.name).lock)
        other = default.lease(lock.name)
        assert other.acquire(0)  # the default app's namespace is another one
        other.release()
        lock.release()
    finally:
        client.close()
        default.close()
