"""``singleton_lock_tasks``: lock tasks by name that cannot take ``base=SingletonTask``
(another package's tasks, ``shared_task``s of apps you do not own).

    app.conf.singleton_lock_tasks = {
        "billing.tasks.nightly_invoice": {"lock_ttl": 3600},
        "reports.*": {"lock_key": ["customer_id"]},
    }

Each registered task whose name matches a key (a name or an ``fnmatch`` glob) becomes a
``SingletonTask`` with those options: its class is replaced by a subclass of SingletonTask and
of its own class, so it runs exactly as a task declared with ``base=SingletonTask`` does, its
own methods kept. The worker step does this as the worker starts, before the pool starts its
processes; :func:`lock_named_tasks` does it in any other process that wants the enqueue-time
options (``lock_on_enqueue``) to apply to its calls too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

from ..exceptions import ConfigurationError
from .task import SingletonTask
from .worker import install

log = logging.getLogger(__name__)

SETTING = "singleton_lock_tasks"


def named_tasks_setting(conf: Any) -> dict[str, dict[str, Any]]:
    """The ``singleton_lock_tasks`` setting, its shape checked: {} when unset."""
    value = conf.get(SETTING, None)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            SETTING,
            f"bad configuration: must be a dict of task name or glob -> dict of lock_* "
            f"options, got {type(value).__name__}",
        )
    checked: dict[str, dict[str, Any]] = {}
    for pattern, options in value.items():
        if not isinstance(pattern, str) or not pattern:
            raise ConfigurationError(
                SETTING, f"bad configuration: a key must be a task name or glob, got {pattern!r}"
            )
        if not isinstance(options, Mapping):
            raise ConfigurationError(
                f"{SETTING}[{pattern!r}]",
                f"bad configuration: must be a dict of lock_* options, got {options!r}",
            )
        for option in options:
            if not isinstance(option, str) or not option.startswith("lock_"):
                raise ConfigurationError(
                    f"{SETTING}[{pattern!r}]",
                    f"bad configuration: {option!r} is not a lock_* option",
                )
        checked[pattern] = dict(options)
    return checked


def lock_named_tasks(app: Any) -> list[str]:
    """Make every task of ``app`` that ``singleton_lock_tasks`` names a SingletonTask with its
    options (idempotent); the names of the tasks it made so. Raises
    :class:`ConfigurationError` for a key that matches no registered task, or an unknown or
    bad option."""
    setting = named_tasks_setting(app.conf)
    if not setting:
        return []
    registered = sorted(app.tasks)  # finalizes the app: every task is registered now
    locked = []
    for pattern, options in setting.items():
        matched = [name for name in registered if fnmatchcase(name, pattern)]
        if not matched:
            raise ConfigurationError(
                f"{SETTING}[{pattern!r}]",
                "bad configuration: matches no registered task (is the module that declares "
                "it imported by the worker? see Celery's imports / autodiscover_tasks)",
            )
        for name in matched:
            if lock_task(app.tasks[name], options, pattern):
                locked.append(name)
    return locked


def lock_task(task: Any, options: dict[str, Any], pattern: str) -> bool:
    """Make ``task`` a SingletonTask with ``options``; False if it is one already (declared
    with ``base=SingletonTask``: its own options stand, and a warning says so)."""
    cls = type(task)
    locked_by = getattr(cls, "_locked_by_name", None)
    if locked_by == pattern:
        return False  # done already, by this key
    if locked_by is not None:
        # Two keys name the task: which options apply would depend on the setting's order.
        raise ConfigurationError(
            f"{SETTING}[{pattern!r}]",
            f"bad configuration: {task.name} is named by {locked_by!r} too; "
            "let one key name each task",
        )
    if isinstance(task, SingletonTask):
        log.warning(
            "%s is a SingletonTask already: %s[%r] left out (set its options on the task)",
            task.name, SETTING, pattern,
        )  # fmt: skip
        return False
    attrs = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "name": task.name,
        "_locked_by_name": pattern,
        **options,
    }
    # SingletonTask first: its run, enqueue and request hooks wrap the task's own methods.
    # Declaring the class checks the options, as for any SingletonTask subclass.
    try:
        locked = type(cls.__name__, (SingletonTask, cls), attrs)
    except ConfigurationError as exc:
        option = exc.argument.rpartition(".")[2]
        problem = str(exc).partition(": ")[2].removeprefix("bad configuration: ")
        raise ConfigurationError(
            f"{SETTING}[{pattern!r}].{option}",
            f"bad configuration: {problem} (for task {task.name})",
        ) from None
    task.__class__ = locked
    install(task.app)  # the worker step, as binding a SingletonTask adds it
    return True


def lock_named_tasks_at_worker_init(app: Any) -> None:
    """At ``worker_init`` (the worker's tasks are imported, its pool not started): lock the
    named tasks and add the worker step. A configuration error is kept for the step to
    raise as the worker starts: raised here, Celery would only log it and start anyway."""
    try:
        lock_named_tasks(app)
    except ConfigurationError as exc:
        app._singleton_lock_named_tasks_error = exc
    install(app)
