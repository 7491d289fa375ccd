"""Task arguments -> lock names.

The name must come out the same at enqueue time (Python objects) and at run time (what the
serializer gave back), so arguments are bound to the task's signature with defaults applied
(``f(1)`` and ``f(x=1)`` are one key) and normalised to a canonical JSON form in which
tuples are lists, dict keys are strings as JSON makes them, sets are sorted, and UUID,
datetime, date, time, Decimal, bytes and Enum values have one spelling each.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import inspect
import json
import reprlib
import string
import uuid
from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring
from typing import Any

from ..exceptions import ConfigurationError


class UnkeyableArgument(TypeError):
    """An argument value with no stable spelling."""


def normalize(value: Any) -> Any:
    """A JSON-ready value that serializer round trips do not change."""
    if isinstance(value, enum.Enum):  # an IntEnum or StrEnum too: by its value
        return normalize(value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [normalize(item) for item in value]
    if isinstance(value, Mapping):
        return {_key(k): normalize(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((normalize(item) for item in value), key=_canonical)
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes:" + bytes(value).hex()
    raise UnkeyableArgument(type(value).__name__)


def _key(key: Any) -> str:
    # JSON object keys are strings: 1 -> "1", True -> "true", None -> "null".
    if isinstance(key, str):
        return key
    normalized = normalize(key)
    return normalized if isinstance(normalized, str) else json.dumps(normalized)


#: ``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``, with the
#: encoder made once: ``json.dumps`` with options makes a new ``JSONEncoder`` on every call.
_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def _template_roots(option: str, template: str) -> list[str]:
    """The argument names a key template formats (``{day}``, ``{user.id}`` -> ``user``)."""
    roots = []
    for _, field, _, _ in string.Formatter().parse(template):
        if field is None:
            continue
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise ConfigurationError(
                option, f"{template!r}: use argument names in braces, not {{{field}}}"
            )
        roots.append(root)
    return roots


class TaskKey:
    """Builds the lock name of one task from its call arguments.

    ``spec`` is the task's ``lock_key``: None (task name + all bound arguments), a format
    string over argument names (``"report:{day}"``), a list of argument names, or a callable
    ``(args, kwargs) -> str``. Checked against the signature when the task is declared.
    """

    def __init__(self, task_name: str, run: Callable[..., Any], spec: Any) -> None:
        self.task_name = task_name
        self.spec = spec
        try:
            self.signature: inspect.Signature | None = inspect.signature(run)
        except (TypeError, ValueError):
            self.signature = None
        #: The parameter names, in order, when every parameter is a plain positional-or-keyword
        #: one without a default: then a call's bound arguments are just its values by name,
        #: with no need for Signature.bind and apply_defaults (which cost more than the rest
        #: of the key). None when the signature has anything else (defaults, *args, **kwargs,
        #: positional- or keyword-only parameters).
        self._plain_names: tuple[str, ...] | None = None
        if self.signature is not None and all(
            p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.default is p.empty
            for p in self.signature.parameters.values()
        ):
            self._plain_names = tuple(self.signature.parameters)
        #: For the default key of plain parameters: (position, '"name":') in the order the
        #: canonical JSON sorts the names, and the name's start, so that a call whose
        #: values are all str or int (not bool, not an Enum) is spelled without building
        #: and encoding a dict (see :meth:`_default_name_of_scalars`).
        self._sorted_fields: tuple[tuple[int, str], ...] = ()
        if self._plain_names is not None and spec is None:
            self._sorted_fields = tuple(
                (self._plain_names.index(name), f"{encode_basestring(name)}:")
                for name in sorted(self._plain_names)
            )
        self._default_start = f"{task_name}:{{"
        option = f"{task_name}.lock_key"
        if spec is None or callable(spec):
            pass
        elif isinstance(spec, str):
            if not spec:
                raise ConfigurationError(option, "must not be empty")
            for root in _template_roots(option, spec):
                if self.signature is not None and root not in self.signature.parameters:
                    raise ConfigurationError(
                        option, f"{spec!r} names {root!r}, which is not an argument of the task"
                    )
        elif isinstance(spec, Sequence) and not isinstance(spec, (str, bytes)):
            if not spec or not all(isinstance(item, str) for item in spec):
                raise ConfigurationError(option, "must be a non-empty list of argument names")
            self.check_arguments("lock_key", spec)
        else:
            raise ConfigurationError(
                option, "must be None, a format string, a list of argument names or a callable"
            )

    def check_arguments(self, option: str, names: Sequence[str]) -> None:
        """Raise ConfigurationError if ``names`` are not all parameters of the task."""
        if self.signature is None:
            return
        missing = [name for name in names if name not in self.signature.parameters]
        if missing:
            raise ConfigurationError(
                f"{self.task_name}.{option}", f"{missing} are not arguments of the task"
            )

    def check_templates(self, option: str, templates: Sequence[str]) -> None:
        """Raise ConfigurationError if a key template names something that is not an argument."""
        for template in templates:
            self.check_arguments(option, _template_roots(f"{self.task_name}.{option}", template))

    def check_defaults(self, keys: Any = None, exclude: Sequence[str] = ()) -> None:
        """Raise ConfigurationError if an argument the key is made of (``keys``: a multi-key
        lock's templates; ``exclude``: a range lock's bounds) has a default with no stable
        spelling: every call that leaves it out would fail to make its key. The values a
        call passes are only known then; a default is known now."""
        if self.signature is None:
            return
        parameters = self.signature.parameters
        for name in self._key_arguments(keys, exclude):
            parameter = parameters.get(name)
            if parameter is None or parameter.default is parameter.empty:
                continue
            try:
                normalize(parameter.default)
            except UnkeyableArgument as exc:
                # A class or function by its name: its repr holds a module path or address.
                shown = getattr(parameter.default, "__qualname__", None)
                raise ConfigurationError(
                    f"{self.task_name} argument {name!r}",
                    f"defaults to {shown or reprlib.repr(parameter.default)} (a {exc}), which "
                    "cannot make a lock key, so every call that leaves it out would fail; "
                    "choose a lock_key of other arguments",
                ) from None

    def _key_arguments(self, keys: Any, exclude: Sequence[str]) -> list[str]:
        """The names of the arguments a call's lock names are made of (none for a callable
        key: it reads what it likes)."""
        if keys is not None:
            if callable(keys):
                return []
            option = f"{self.task_name}.lock_keys"
            return [root for template in keys for root in _template_roots(option, template)]
        spec = self.spec
        if callable(spec):
            return []
        if isinstance(spec, str):
            return _template_roots(f"{self.task_name}.lock_key", spec)
        if spec is not None:
            return list(spec)
        parameters = self.signature.parameters if self.signature is not None else {}
        return [name for name in parameters if name not in exclude]

    def bounds(
        self, spec: tuple[str, str], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[float, float]:
        """The interval [lo, hi] of a range-locked call, from the arguments named by ``spec``."""
        bound = self.bind(args, kwargs)
        values = []
        for argument in spec:
            value = bound.get(argument)
            if isinstance(value, bool) or not isinstance(value, (int, float, decimal.Decimal)):
                raise ConfigurationError(
                    f"{self.task_name} argument {argument!r}",
                    f"a range bound must be a number, got {value!r}",
                )
            try:
                values.append(float(value))
            except (OverflowError, ValueError):  # 10**400, Decimal("sNaN")
                raise ConfigurationError(
                    f"{self.task_name} argument {argument!r}",
                    f"a range bound must fit a double, got {value!r}",
                ) from None
        return values[0], values[1]

    def names(self, spec: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[str]:
        """The lock names of a multi-key call: ``spec`` is a list of templates or a callable
        ``(args, kwargs) -> list of str``."""
        if callable(spec):
            result = spec(tuple(args), dict(kwargs))
            if isinstance(result, str) or not all(isinstance(n, str) and n for n in result):
                raise ConfigurationError(
                    f"{self.task_name}.lock_keys",
                    f"callable returned {result!r}, not a list of names",
                )
            return list(result)
        bound = self.bind(args, kwargs)
        values = {k: self._value(k, v, scalar=True) for k, v in bound.items()}
        return [template.format(**values) for template in spec]

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments by parameter name, defaults applied."""
        names = self._plain_names
        if names is not None:
            if not kwargs:
                if len(args) == len(names):
                    return dict(zip(names, args, strict=True))
            elif len(args) + len(kwargs) == len(names):
                # As Signature.bind orders them: by parameter, whichever way each was passed.
                rest = names[len(args) :]
                if all(name in kwargs for name in rest):
                    by_name = dict(zip(names, args, strict=False))
                    for name in rest:
                        by_name[name] = kwargs[name]
                    return by_name
            # Anything else (missing, extra or doubled arguments) is Signature.bind's to judge.
        if self.signature is None:
            return {"args": list(args), "kwargs": dict(kwargs)}
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise ConfigurationError(
                f"{self.task_name} arguments", f"do not fit the task's signature: {exc}"
            ) from None
        bound.apply_defaults()
        return dict(bound.arguments)

    def name(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], exclude: Sequence[str] = ()
    ) -> str:
        """The lock name for one call; arguments in ``exclude`` (a range lock's bounds) are
        not part of a default key."""
        spec = self.spec
        if callable(spec):
            result = spec(tuple(args), dict(kwargs))
            if not isinstance(result, str) or not result:
                raise ConfigurationError(
                    f"{self.task_name}.lock_key", f"callable returned {result!r}, not a str"
                )
            return result
        if spec is None and not kwargs and not exclude and self._plain_names is not None:
            name = self._default_name_of_scalars(args)
            if name is not None:
                return name
        bound = self.bind(args, kwargs)
        if isinstance(spec, str):
            return spec.format(**{k: self._value(k, v, scalar=True) for k, v in bound.items()})
        if spec is not None:
            bound = {k: bound[k] for k in spec}
        else:
            bound = {k: v for k, v in bound.items() if k not in exclude}
        body = {k: self._value(k, v) for k, v in bound.items()}
        return f"{self.task_name}:{_canonical(body)}"

    def _default_name_of_scalars(self, args: Sequence[Any]) -> str | None:
        """The default key of a call passing every plain parameter positionally, when each
        value is exactly a str or an int: what ``_canonical`` makes of ``{name: value}``
        (keys sorted, no spaces, strings escaped by JSON's own function); None for any other
        call, which takes the general path. This is on every task run's path."""
        fields = self._sorted_fields
        if len(args) != len(fields):
            return None
        parts = []
        for position, field in fields:
            value = args[position]
            kind = type(value)
            if kind is str:
                parts.append(field + encode_basestring(value))
            elif kind is int:
                parts.append(field + int.__repr__(value))
            else:
                return None
        return self._default_start + ",".join(parts) + "}"

    def _value(self, argument: str, value: Any, *, scalar: bool = False) -> Any:
        try:
            normalized = normalize(value)
        except UnkeyableArgument as exc:
            raise ConfigurationError(
                f"{self.task_name} argument {argument!r}",
                f"a {exc} cannot make a lock key; choose one with lock_key",
            ) from None
        if scalar and isinstance(normalized, list | dict):  # not None, bool, int, float or str
            return _canonical(normalized)
        return normalized
