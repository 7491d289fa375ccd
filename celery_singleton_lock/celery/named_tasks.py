"""``singleton_lock_tasks``: lock tasks by name that cannot take ``base=SingletonTask``
(another package's tasks, ``shared_task``s of apps you do not own).

    app.conf.singleton_lock_tasks = {
        "billing.tasks.nightly_invoice": {"lock_ttl": 3600},
        "reports.*": {"lock_key": ["customer_id"]},
    }

Each registered task whose name matches a key (a name or an ``fnmatch`` glob) becomes a
``SingletonTask`` with those options: its class is replaced by a subclass of SingletonTask and
of its own class, so it runs exactly as a task declared with ``base=SingletonTask`` does, its
own methods kept (a ``__call__`` of its class runs inside the lock). The worker step does this
as the worker starts, before the pool starts its processes; :func:`lock_named_tasks` does it in
any other process that wants the enqueue-time options (``lock_on_enqueue``) to apply to its
calls too.

A glob never converts Celery's own tasks (``celery.*``: chord_unlock and the like keep
canvases going); an exact name does, and every converted task's key is checked first
(:func:`check_key`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

from ..exceptions import ConfigurationError
from .task import SingletonTask
from .task_keys import TaskKey
from .worker import install

log = logging.getLogger(__name__)

SETTING = "singleton_lock_tasks"

#: The names of Celery's own tasks (``celery.chord_unlock``, ``celery.backend_cleanup``,
#: ``celery.accumulate``, ...), which a glob never converts.
BUILT_IN_PREFIX = "celery."


def is_glob(pattern: str) -> bool:
    """Whether ``pattern`` is an ``fnmatch`` glob rather than one task's exact name."""
    return any(char in pattern for char in "*?[")


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
        built_in = []
        if is_glob(pattern):
            # Celery's own tasks keep canvases and the backend going, and take arguments no
            # default key is made of (chord_unlock: every run would fail, chords would never
            # complete): a glob meant for your tasks leaves them alone.
            built_in = [name for name in matched if name.startswith(BUILT_IN_PREFIX)]
            matched = [name for name in matched if not name.startswith(BUILT_IN_PREFIX)]
        if not matched and built_in:
            raise ConfigurationError(
                f"{SETTING}[{pattern!r}]",
                "bad configuration: matches only Celery's built-in tasks, which a glob never "
                "converts; name one exactly to lock it (e.g. 'celery.backend_cleanup')",
            )
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
    check_key(task, options, pattern)
    task.__class__ = locked
    install(task.app)  # the worker step, as binding a SingletonTask adds it
    return True


def check_key(task: Any, options: dict[str, Any], pattern: str) -> None:
    """Raise :class:`ConfigurationError` if ``task``'s lock key under ``options`` can never
    be built: it names no argument of the task, or is made of an argument whose default has
    no stable spelling (``celery.chord_unlock``'s ``Result=AsyncResult``: every run would
    fail). The arguments a call passes are not known before it; Celery's own tasks pass
    their canvases and results, which make keys."""
    try:
        naming = TaskKey(task.name, task.run, options.get("lock_key"))
        naming.check_defaults(options.get("lock_keys"), options.get("lock_range") or ())
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"{SETTING}[{pattern!r}]",
            f"bad configuration: {task.name}'s lock key cannot be built: {exc}",
        ) from None


def lock_named_tasks_at_worker_init(app: Any) -> None:
    """At ``worker_init`` (the worker's tasks are imported, its pool not started): lock the
    named tasks and add the worker step. A configuration error is kept for the step to
    raise as the worker starts: raised here, Celery would only log it and start anyway."""
    try:
        lock_named_tasks(app)
    except ConfigurationError as exc:
        app._singleton_lock_named_tasks_error = exc
    install(app)
