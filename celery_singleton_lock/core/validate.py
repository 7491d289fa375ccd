"""Checks on public arguments: each bad value raises ConfigurationError naming it,
before anything talks to Redis."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..exceptions import ConfigurationError
from .pid_evidence import this_place_text

#: The longest lease, max-hold or release delay (ten years). Longer ones do not survive the
#: Lua scripts' number formatting (Redis rejects the PEXPIRE after the holder was written,
#: leaving a lock that never expires) nor the heartbeat's wait (OverflowError kills it).
MAX_SECONDS = 10 * 365 * 24 * 3600.0


def check_name(name: object, argument: str = "name") -> str:
    if not isinstance(name, str):
        raise ConfigurationError(argument, f"must be a str, got {type(name).__name__}")
    if not name:
        raise ConfigurationError(argument, "must not be empty")
    return name


def check_prefix(prefix: object) -> str:
    """A key prefix: a str without hash-tag braces (they would move keys across slots)."""
    if not isinstance(prefix, str):
        raise ConfigurationError("prefix", f"must be a str, got {type(prefix).__name__}")
    if "{" in prefix or "}" in prefix:
        raise ConfigurationError("prefix", "must not contain '{' or '}' (hash-tag braces)")
    return prefix


def check_real(value: object, argument: str, what: str = "a real number") -> float:
    """A real number as a float: ``±math.inf`` allowed, never NaN, a bool, or an int too
    large for a double."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(argument, f"must be {what}, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        raise ConfigurationError(argument, f"out of range of a double: {value!r}") from None
    if math.isnan(number):
        raise ConfigurationError(argument, "must not be NaN")
    return number


def _number(value: object, argument: str) -> float:
    return check_real(value, argument, "a number of seconds")


def check_positive(value: object, argument: str) -> float:
    """A finite number of seconds > 0 (a lease length)."""
    number = _number(value, argument)
    if number <= 0 or math.isinf(number):
        raise ConfigurationError(argument, f"must be a finite number > 0, got {value!r}")
    if number < 0.001:
        raise ConfigurationError(argument, f"must be at least 0.001 s, got {value!r}")
    if number > MAX_SECONDS:
        raise ConfigurationError(argument, f"must be at most {MAX_SECONDS:.0f} s, got {value!r}")
    return number


def check_wait(value: object, argument: str = "wait") -> float:
    """A number of seconds >= 0; ``math.inf`` means forever."""
    if type(value) is float and value >= 0:  # the common case, on every acquire and release
        return value
    number = _number(value, argument)
    if number < 0:
        raise ConfigurationError(argument, f"must be >= 0, got {value!r}")
    return number


def check_delay(value: object, argument: str = "delay") -> float:
    """A finite number of seconds >= 0."""
    if (type(value) is float or type(value) is int) and value == 0:  # release(): no delay
        return 0.0
    number = check_wait(value, argument)
    if math.isinf(number):
        raise ConfigurationError(argument, "must be finite")
    if number > MAX_SECONDS:
        raise ConfigurationError(argument, f"must be at most {MAX_SECONDS:.0f} s, got {value!r}")
    return number


def check_max_hold(value: object, ttl: float) -> float | None:
    if value is None:
        return None
    number = check_positive(value, "max_hold")
    if number < ttl:
        raise ConfigurationError("max_hold", f"must be >= ttl ({ttl}), got {value!r}")
    return number


def check_bool(value: object, argument: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(argument, f"must be True or False, got {value!r}")
    return value


def check_owner_info(value: object) -> dict[str, str]:
    """Free-form facts about the holder, shown by the admin command."""
    if value is None:
        return {}
    if type(value) is dict and all(
        type(key) is str and type(item) is str and key and key.isascii() and item.isascii()
        for key, item in value.items()
    ):
        return dict(value)  # ASCII text only (task names and ids): nothing more to check
    if not isinstance(value, Mapping):
        raise ConfigurationError("owner_info", f"must be a mapping, got {type(value).__name__}")
    info: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise ConfigurationError("owner_info", f"keys must be non-empty str, got {key!r}")
        if not isinstance(item, (str, int, float)) or isinstance(item, bool):
            raise ConfigurationError(
                "owner_info", f"value of {key!r} must be str or number, got {item!r}"
            )
        for text in (key, str(item)):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # redis-py would fail on it at acquire
                raise ConfigurationError(
                    "owner_info", f"{text!r} is not valid unicode (lone surrogate)"
                ) from None
        info[key] = str(item)
    return info


def seconds_to_ms(seconds: float) -> int:
    """Seconds in the public API become whole milliseconds at the Lua boundary."""
    return max(1, math.ceil(seconds * 1000))


def check_callable(value: Any, argument: str) -> Any:
    if value is not None and not callable(value):
        raise ConfigurationError(argument, f"must be callable or None, got {value!r}")
    return value


def check_token(value: object, argument: str = "token") -> int:
    """A fencing token (tokens start at 1), a pid, a limit: an int >= 1, never a bool, a
    float or NaN, which ``int()`` would truncate or refuse with a TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(argument, f"must be an int >= 1, got {value!r}")
    return value


def check_optional_token(value: object, argument: str = "token") -> int | None:
    return None if value is None else check_token(value, argument)


def check_text(value: object, argument: str) -> str:
    """A non-empty str that Redis can store (no lone surrogate): a task id, a host."""
    text = check_name(value, argument)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(argument, f"{text!r} is not valid unicode") from None
    return text


def check_owner(value: object, argument: str = "owner") -> str:
    """An owner token given by the caller (a claim's): as :func:`check_text`, and without
    hash-tag braces. A token names keys (a fair waiter's ``P{T}:w:<owner>``), and a brace
    there could make one match another kind's listing pattern (core/keys.py)."""
    owner = check_text(value, argument)
    if "{" in owner or "}" in owner:
        raise ConfigurationError(argument, f"must not contain '{{' or '}}', got {owner!r}")
    return owner


def check_pattern(value: object, argument: str = "pattern") -> str | None:
    """A glob pattern over lock names, or None for every lock."""
    if value is not None and not isinstance(value, str):
        raise ConfigurationError(argument, f"must be a str or None, got {type(value).__name__}")
    return value


class HolderProcess(NamedTuple):
    """The process a supervisor releases a lock for (``release_holder``): the task it ran,
    its pid and host as the holder records store them, and the release delay in ms (0: free
    at once)."""

    task_id: str
    pid: int
    host: str
    delay_ms: int
    #: How the holder record's process mark (``proc``, core/pid_evidence.py) begins, as far
    #: as the caller knows it: on this machine the place (boot and namespaces) of the
    #: caller, which a supervisor's child shares; '' on another host.
    proc: str


def check_holder_process(
    task_id: object, pid: object, host: object, delay: object, default_host: str
) -> HolderProcess:
    """The arguments of every ``release_holder``: ``task_id`` a non-empty str, ``pid`` an int
    >= 1, ``host`` a non-empty str or None (``default_host``: this machine), ``delay`` seconds
    as :func:`check_delay`. A ``pid`` on this machine is one of this process's pid namespace
    (a supervisor's child's): a hold whose record marks a process of another is not its."""
    checked_task = check_text(task_id, "task_id")
    checked_pid = check_token(pid, "pid")
    checked_host = default_host if host is None else check_text(host, "host")
    seconds = check_delay(delay)
    return HolderProcess(
        checked_task,
        checked_pid,
        checked_host,
        seconds_to_ms(seconds) if seconds > 0 else 0,
        this_place_text() if checked_host == default_host else "",
    )
