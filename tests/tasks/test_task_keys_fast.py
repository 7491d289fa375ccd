"""The default key's fast path (plain parameters, no Signature.bind) makes the very names the
signature-bound path makes, for every argument shape, and leaves the rest to it."""

from __future__ import annotations

import copy
import datetime
import decimal
import enum
import itertools
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from celery_singleton_lock import ConfigurationError
from celery_singleton_lock.celery.task_keys import TaskKey


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


VALUES: list[Any] = [
    0,
    -7,
    10**30,
    1.5,
    float("inf"),
    True,
    None,
    "",
    "ünïcode",
    (1, 2),
    ["a", ("b", "c")],
    {"b": 1, "a": [1, 2], 3: "int key", None: {"nested": (Color.RED,)}},
    {2, 1, 3},
    frozenset({"x"}),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    datetime.datetime(2026, 11, 22, 10, 30, tzinfo=datetime.timezone.utc),
    datetime.date(2026, 11, 22),
    datetime.time(10, 30),
    decimal.Decimal("10.50"),
    b"\x00\xff",
    Color.RED,
    Level.HIGH,
]


def none() -> None: ...


def one(a: Any) -> None: ...


def two(a: Any, b: Any) -> None: ...


def three(a: Any, b: Any, c: Any) -> None: ...


def slow_twin(key: TaskKey) -> TaskKey:
    """The same key with the fast path off: every call goes through Signature.bind."""
    twin = copy.copy(key)
    twin._plain_names = None
    return twin


def outcome(call: Callable[..., Any], *arguments: Any, **options: Any) -> tuple[str, Any]:
    try:
        return "ok", call(*arguments, **options)
    except ConfigurationError as exc:
        return "error", str(exc)


def bound_items(key: TaskKey, args: Any, kwargs: Any) -> list[tuple[str, Any]]:
    """The bound arguments in their order (a template or a range's bounds read them so)."""
    return list(key.bind(args, kwargs).items())


def shapes(
    names: tuple[str, ...], values: list[Any]
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Every split of ``values`` over ``names`` into positional and keyword arguments (in
    both keyword orders), and the wrong ones: a missing, an extra, a doubled argument."""
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    for split in range(len(names) + 1):
        args = tuple(values[:split])
        kwargs = dict(zip(names[split:], values[split:], strict=True))
        calls.append((args, kwargs))
        calls.append((args, dict(reversed(list(kwargs.items())))))
    calls.append((tuple(values[:-1]), {}))
    calls.append((tuple(values) + (1,), {}))
    calls.append((tuple(values), {"extra": 1}))
    if names:
        calls.append((tuple(values), {names[0]: values[0]}))
        calls.append(((), {name: value for name, value in zip(names[1:], values[1:], strict=True)}))
        calls.append(((), {**dict(zip(names, values, strict=True)), "extra": 2}))
    return calls


@pytest.mark.parametrize("run", [none, one, two, three])
def test_the_fast_path_names_every_call_as_the_signature_does(run: Callable[..., Any]) -> None:
    key = TaskKey("tasks.job", run, None)
    names = key._plain_names
    assert names is not None
    twin = slow_twin(key)
    seen = 0
    for values in itertools.islice(itertools.permutations(VALUES, len(names)), 400):
        for args, kwargs in shapes(names, list(values)):
            fast = outcome(key.name, args, kwargs)
            assert fast == outcome(twin.name, args, kwargs), (args, kwargs)
            assert outcome(bound_items, key, args, kwargs) == outcome(
                bound_items, twin, args, kwargs
            )
            if names:
                excluded = outcome(key.name, args, kwargs, exclude=names[:1])
                assert excluded == outcome(twin.name, args, kwargs, exclude=names[:1])
            seen += fast[0] == "ok"
    assert seen > 0


def test_keyword_arguments_bind_in_parameter_order() -> None:
    key = TaskKey("tasks.job", three, None)
    assert list(key.bind((1,), {"c": 3, "b": 2})) == ["a", "b", "c"]
    assert (
        key.name((1,), {"c": 3, "b": 2})
        == key.name((1, 2, 3), {})
        == 'tasks.job:{"a":1,"b":2,"c":3}'
    )


def test_a_value_with_no_spelling_is_refused_as_before() -> None:
    key = TaskKey("tasks.job", two, None)
    twin = slow_twin(key)
    for args, kwargs in [((object(), 1), {}), ((1,), {"b": object()})]:
        fast = outcome(key.name, args, kwargs)
        assert fast[0] == "error"
        assert fast == outcome(twin.name, args, kwargs)


def with_default(a: Any, b: Any = 2) -> None: ...


def star_args(a: Any, *rest: Any) -> None: ...


def star_kwargs(a: Any, **rest: Any) -> None: ...


def keyword_only(a: Any, *, b: Any) -> None: ...


def positional_only(a: Any, /, b: Any) -> None: ...


@pytest.mark.parametrize(
    "run", [with_default, star_args, star_kwargs, keyword_only, positional_only, len]
)
def test_any_other_signature_goes_through_signature_bind(run: Callable[..., Any]) -> None:
    key = TaskKey("tasks.job", run, None)
    assert key._plain_names is None
    for args, kwargs in [((1,), {}), ((1, 2), {}), ((1,), {"b": 2}), ((), {"a": 1, "b": 2})]:
        assert outcome(key.name, args, kwargs) == outcome(slow_twin(key).name, args, kwargs)


def test_a_key_template_or_list_names_the_same_with_the_fast_path() -> None:
    for spec in ["report:{a}:{b}", ["b"]]:
        key = TaskKey("tasks.job", two, spec)
        twin = slow_twin(key)
        for args, kwargs in shapes(("a", "b"), [Color.RED, {"k": (1, 2)}]):
            assert outcome(key.name, args, kwargs) == outcome(twin.name, args, kwargs)


class Text(str):
    pass


class Number(int):
    pass


SCALARS: list[Any] = [
    "",
    "plain",
    'quote " and \\ backslash',
    "\n\t\r\x00\x1f\x7f control",
    "ünïcode ✓ \u2028 \U0001f600",
    "lone \ud800 surrogate",
    0,
    -1,
    10**40,
    -(10**40),
    True,
    False,
    Text("a str subclass"),
    Number(5),
    Level.HIGH,
    1.0,
    None,
]


def reversed_names(zeta: Any, alpha: Any, émile: Any) -> None: ...


@pytest.mark.parametrize("run", [none, one, three, reversed_names])
def test_str_and_int_values_are_spelled_as_the_canonical_json_spells_them(
    run: Callable[..., Any],
) -> None:
    """The default key of a call of str and int values skips building and encoding a dict;
    it must come out as the general path's JSON does, for every value (escapes, surrogates,
    big ints) and for parameter names in any order; anything else takes the general path."""
    key = TaskKey("tasks.job", run, None)
    twin = slow_twin(key)
    width = len(key._plain_names or ())
    for values in (
        itertools.product(SCALARS, repeat=width)
        if width < 3
        else (itertools.islice(itertools.permutations(SCALARS, width), 2000))
    ):
        assert key.name(values, {}) == twin.name(values, {}), values
    shortcut = key._default_name_of_scalars(("x",) * width)
    assert shortcut == twin.name(("x",) * width, {})
