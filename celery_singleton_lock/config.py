"""Settings read from ``app.conf`` and the task options they default, validated and frozen.

Precedence, per option: the task's attribute (``@app.task(lock_ttl=...)``), then the app
setting ``singleton_lock_<option without lock_>`` (``CELERY_SINGLETON_LOCK_TTL`` in Django),
then the built-in default below.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import arguments
from .exceptions import ConfigurationError

CONFLICT_POLICIES = ("skip", "retry", "raise")
BACKEND_DOWN_POLICIES = ("fail", "run")
LOCK_MODES = ("exclusive", "read", "upgradable", "write")


def _seconds(value: Any, argument: str) -> float:
    return arguments.check_positive(value, argument)


def _wait(value: Any, argument: str) -> float:
    return arguments.check_wait(value, argument)


def _delay(value: Any, argument: str) -> float:
    return arguments.check_delay(value, argument)


#: ``lock_on_enqueue`` value: claim only while the call is queued (see enqueue.py).
UNTIL_START = "until_start"
#: ``lock_on_enqueue`` value: as UNTIL_START, but a new call replaces the queued one.
DEBOUNCE = "debounce"
#: ``lock_on_enqueue`` values besides True and False.
ON_ENQUEUE_MODES = (UNTIL_START, DEBOUNCE)


def _on_enqueue(value: Any, argument: str) -> bool | str:
    if value in ON_ENQUEUE_MODES:
        return str(value)
    if isinstance(value, bool):
        return value
    raise ConfigurationError(
        argument, f"must be True, False or one of {list(ON_ENQUEUE_MODES)}, got {value!r}"
    )


def _choice(choices: Sequence[str]) -> Callable[[Any, str], str]:
    def check(value: Any, argument: str) -> str:
        if value not in choices:
            raise ConfigurationError(argument, f"must be one of {list(choices)}, got {value!r}")
        return str(value)

    return check


def _any(value: Any, argument: str) -> Any:
    return value  # checked against the task's signature by naming.TaskKey


def _range(value: Any, argument: str) -> tuple[str, str] | None:
    if value is None:
        return None
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(item, str) and item for item in value)
    ):
        raise ConfigurationError(argument, f"must be two argument names, got {value!r}")
    return (value[0], value[1])


def _keys(value: Any, argument: str) -> Any:
    if value is None or callable(value):
        return value
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(item, str) and item for item in value)
    ):
        return tuple(value)
    raise ConfigurationError(
        argument, f"must be a list of key templates or a callable, got {value!r}"
    )


#: option -> (built-in default, checker). Every ``lock_*`` attribute must be one of these.
TASK_OPTIONS: dict[str, tuple[Any, Callable[[Any, str], Any]]] = {
    "lock_ttl": (3600.0, _seconds),
    "lock_lease": (30.0, _seconds),
    "lock_key": (None, _any),
    "lock_wait": (0.0, _wait),
    "lock_conflict": ("skip", _choice(CONFLICT_POLICIES)),
    "lock_retry_countdown": (10.0, _delay),
    "lock_release_delay": (0.0, _delay),
    "lock_on_enqueue": (False, _on_enqueue),
    "lock_mode": ("exclusive", _choice(LOCK_MODES)),
    "lock_range": (None, _range),
    "lock_keys": (None, _keys),
    "lock_backend_down": ("fail", _choice(BACKEND_DOWN_POLICIES)),
}

#: Options with no app-wide setting: they only make sense per task.
PER_TASK_ONLY = ("lock_key", "lock_range", "lock_keys")


def setting_name(option: str) -> str:
    """``lock_ttl`` -> ``singleton_lock_ttl``."""
    return "singleton_lock_" + option.removeprefix("lock_")


def check_task_options(task_name: str, attrs: dict[str, Any]) -> None:
    """Reject unknown ``lock_*`` attributes and bad values where a task is declared."""
    for option, value in attrs.items():
        if not option.startswith("lock_"):
            continue
        if option not in TASK_OPTIONS:
            known = ", ".join(sorted(TASK_OPTIONS))
            raise ConfigurationError(
                f"{task_name}.{option}", f"unknown option (known options: {known})"
            )
        if value is not None:
            TASK_OPTIONS[option][1](value, f"{task_name}.{option}")


@dataclass(frozen=True)
class TaskLockOptions:
    """The resolved lock options of one task."""

    ttl: float
    lease: float
    key: Any
    wait: float
    conflict: str
    retry_countdown: float
    release_delay: float
    on_enqueue: bool | str
    mode: str
    range: tuple[str, str] | None
    keys: Any
    backend_down: str

    @classmethod
    def resolve(cls, task_name: str, task: Any, conf: Any) -> TaskLockOptions:
        values: dict[str, Any] = {}
        for option, (default, check) in TASK_OPTIONS.items():
            # Static lookup: a callable lock_key stored on the class must not become a method.
            value = inspect.getattr_static(task, option, None)
            if isinstance(value, staticmethod):
                value = value.__func__
            where = f"{task_name}.{option}"
            if value is None and option not in PER_TASK_ONLY:
                where = setting_name(option)
                value = conf.get(where, None)
            if value is None:
                value = default
            values[option.removeprefix("lock_")] = (
                check(value, where) if value is not None else None
            )
        options = cls(**values)
        if options.lease > options.ttl:
            raise ConfigurationError(
                f"{task_name}.lock_lease",
                f"({options.lease} s) must not exceed lock_ttl ({options.ttl} s)",
            )
        if options.on_enqueue and (
            options.mode != "exclusive" or options.range is not None or options.keys is not None
        ):
            raise ConfigurationError(
                f"{task_name}.lock_on_enqueue", "works with exclusive single-key locks only"
            )
        if options.range is not None and options.keys is not None:
            raise ConfigurationError(f"{task_name}.lock_keys", "cannot be combined with lock_range")
        if options.keys is not None and options.mode != "exclusive":
            raise ConfigurationError(
                f"{task_name}.lock_mode", "multi-key locks (lock_keys) are exclusive"
            )
        if math.isinf(options.wait) and options.conflict == "retry":
            raise ConfigurationError(
                f"{task_name}.lock_conflict", "'retry' makes no sense with an infinite lock_wait"
            )
        return options


@dataclass(frozen=True)
class AppSettings:
    """App-wide settings: where the locks live."""

    url: str
    prefix: str

    def __repr__(self) -> str:
        from .client import mask_password

        return f"AppSettings(url={mask_password(self.url)!r}, prefix={self.prefix!r})"

    @classmethod
    def from_conf(cls, conf: Any) -> AppSettings:
        url = conf.get("singleton_lock_url", None)
        if url is None:
            broker = conf.get("broker_url", None) or ""
            if isinstance(broker, str) and broker.split("://", 1)[0] in (
                "redis",
                "rediss",
                "unix",
            ):
                url = broker
        if not isinstance(url, str) or not url:
            raise ConfigurationError(
                "singleton_lock_url",
                "must be set (a redis:// URL) when the broker is not Redis",
            )
        prefix = conf.get("singleton_lock_prefix", None) or "csl:"
        if not isinstance(prefix, str):
            raise ConfigurationError("singleton_lock_prefix", f"must be a str, got {prefix!r}")
        return cls(url=url, prefix=prefix)
