"""Task arguments -> lock names, and option checks at declaration."""

from __future__ import annotations

import datetime
import decimal
import enum
import uuid
from typing import Any

import pytest
from celery import Celery
from kombu.serialization import dumps, loads

from celery_singleton_lock import ConfigurationError, SingletonTask


class Color(enum.Enum):
    RED = "red"


ARGUMENTS: list[Any] = [
    (1, 2),
    ["a", ("b", "c")],
    {"b": 1, "a": [1, 2], 3: "int key"},
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    datetime.datetime(2026, 11, 22, 10, 30, tzinfo=datetime.timezone.utc),
    datetime.date(2026, 11, 22),
    decimal.Decimal("10.50"),
    None,
    True,
    1.5,
    "ünïcode",
]


def make_app() -> Celery:
    return Celery("keys", set_as_current=False, broker="memory://")


def test_positional_keyword_and_default_arguments_make_one_key() -> None:
    app = make_app()

    @app.task(base=SingletonTask, shared=False)
    def job(customer: int, day: str = "today") -> None: ...

    names = {
        job.lock_name((1,), {}),
        job.lock_name((), {"customer": 1}),
        job.lock_name((1, "today"), {}),
        job.lock_name((), {"day": "today", "customer": 1}),
    }
    assert len(names) == 1
    assert job.lock_name((2,), {}) not in names
    assert job.lock_name((1, "tomorrow"), {}) not in names


# What each serializer can carry at all (yaml has no UUID/Decimal, msgpack no dates, UUIDs,
# Decimals or int map keys): a value it cannot encode cannot be sent, so has no key question.
BASIC = [(1, 2), ["a", ("b", "c")], {"b": 1, "a": [1, 2]}, None, True, 1.5, "ünïcode"]
ROUND_TRIPS = (
    [("json", value) for value in ARGUMENTS]
    + [("pickle", value) for value in ARGUMENTS]
    + [
        ("yaml", value)
        for value in ARGUMENTS
        if not isinstance(value, (uuid.UUID, decimal.Decimal))
    ]
    + [("msgpack", value) for value in BASIC]
)


@pytest.mark.parametrize(("serializer", "value"), ROUND_TRIPS, ids=repr)
def test_key_survives_serializer_round_trip(serializer: str, value: Any) -> None:
    app = make_app()

    @app.task(base=SingletonTask, shared=False)
    def job(value: Any, extra: Any = None) -> None: ...

    content_type, encoding, body = dumps(((value,), {"extra": {"k": value}}), serializer=serializer)
    args, kwargs = loads(body, content_type, encoding, accept={content_type})
    assert job.lock_name(args, kwargs) == job.lock_name((value,), {"extra": {"k": value}})


def test_dict_order_does_not_matter() -> None:
    app = make_app()

    @app.task(base=SingletonTask, shared=False)
    def job(options: dict[str, int]) -> None: ...

    assert job.lock_name(({"a": 1, "b": 2},), {}) == job.lock_name(({"b": 2, "a": 1},), {})


def test_format_string_key() -> None:
    app = make_app()

    @app.task(base=SingletonTask, shared=False, lock_key="report:{day}")
    def report(day: datetime.date, verbose: bool = False) -> None: ...

    assert report.lock_name((datetime.date(2026, 11, 22),), {}) == "report:2026-11-22"
    assert report.lock_name((), {"day": "2026-11-22", "verbose": True}) == "report:2026-11-22"


def test_argument_list_key() -> None:
    app = make_app()

    @app.task(base=SingletonTask, shared=False, lock_key=["customer_id"])
    def sync(customer_id: int, full: bool = False) -> None: ...

    assert sync.lock_name((7, True), {}) == sync.lock_name((7,), {"full": False})
    assert sync.lock_name((7,), {}) != sync.lock_name((8,), {})


def test_callable_key() -> None:
    app = make_app()

    @app.task(base=SingletonTask, shared=False, lock_key=lambda args, kwargs: f"import:{args[0]}")
    def imp(path: str) -> None: ...

    assert imp.lock_name(("a.csv",), {}) == "import:a.csv"


def test_enum_is_keyed_by_its_value() -> None:
    app = make_app()

    @app.task(base=SingletonTask, shared=False)
    def paint(color: Any) -> None: ...

    assert paint.lock_name((Color.RED,), {}) == paint.lock_name(("red",), {})


def test_unknown_option_is_refused_at_first_use() -> None:
    app = make_app()

    @app.task(base=SingletonTask, lock_tll=5, shared=False)
    def job() -> None: ...

    # Created lazily, at finalize, which keeps the error for the worker's start and the
    # first delay() or apply() (see SingletonTask.__init_subclass__).
    with pytest.raises(ConfigurationError) as info:
        job.delay()
    assert "lock_tll" in str(info.value)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("lock_ttl", 0),
        ("lock_ttl", "1h"),
        ("lock_lease", -1),
        ("lock_wait", -1),
        ("lock_conflict", "ignore"),
        ("lock_release_delay", float("nan")),
        ("lock_on_enqueue", "yes"),
        ("lock_mode", "shared"),
        ("lock_backend_down", "panic"),
        ("lock_range", ("start",)),
        ("lock_keys", "not-a-list"),
    ],
)
def test_bad_option_value_names_task_and_option(option: str, value: Any) -> None:
    app = make_app()

    @app.task(base=SingletonTask, name="keys.bad", shared=False, **{option: value})
    def job() -> None: ...

    with pytest.raises(ConfigurationError) as info:
        job.delay()
    assert info.value.argument == f"keys.bad.{option}"


def test_key_template_naming_a_missing_argument_is_refused() -> None:
    app = make_app()

    @app.task(base=SingletonTask, name="keys.tpl", lock_key="r:{missing}", shared=False)
    def job(day: str) -> None: ...

    with pytest.raises(ConfigurationError) as info:
        job.lock_name(("x",), {})
    assert info.value.argument == "keys.tpl.lock_key"
    assert "missing" in str(info.value)


def test_unkeyable_argument_names_task_and_argument() -> None:
    app = make_app()

    @app.task(base=SingletonTask, name="keys.obj", shared=False)
    def job(thing: object) -> None: ...

    with pytest.raises(ConfigurationError) as info:
        job.lock_name((object(),), {})
    assert "keys.obj" in str(info.value) and "'thing'" in str(info.value)


def test_lease_longer_than_ttl_is_refused() -> None:
    app = make_app()

    @app.task(base=SingletonTask, name="keys.lease", lock_ttl=10, lock_lease=60, shared=False)
    def job() -> None: ...

    with pytest.raises(ConfigurationError) as info:
        job.lock_options  # noqa: B018
    assert info.value.argument == "keys.lease.lock_lease"


def test_app_settings_give_defaults_and_task_options_win() -> None:
    app = make_app()
    app.conf.singleton_lock_lease = 5
    app.conf.singleton_lock_conflict = "raise"

    @app.task(base=SingletonTask, name="keys.conf", lock_conflict="retry", shared=False)
    def job() -> None: ...

    assert job.lock_options.lease == 5
    assert job.lock_options.conflict == "retry"
    assert job.lock_options.max_hold == 3600


def test_lock_url_defaults_to_a_redis_broker_and_is_required_otherwise() -> None:
    from celery_singleton_lock.celery.options import AppSettings

    app = Celery("u", set_as_current=False, broker="redis://example:6379/3")
    assert AppSettings.from_conf(app.conf).url == "redis://example:6379/3"
    amqp = Celery("u", set_as_current=False, broker="amqp://guest@localhost//")
    with pytest.raises(ConfigurationError) as info:
        AppSettings.from_conf(amqp.conf)
    assert info.value.argument == "singleton_lock_url"
