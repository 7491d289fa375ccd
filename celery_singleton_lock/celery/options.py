"""Settings read from ``app.conf`` and the task options they default, validated and frozen.

Precedence, per option: the task's attribute (``@app.task(lock_ttl=...)``), then the app
setting ``singleton_lock_<option without lock_>`` (``CELERY_SINGLETON_LOCK_TTL`` in Django),
then the built-in default below. The default ``lock_lease`` adapts to a short ``lock_ttl``
(a third of it); a lease set explicitly above the ttl is an error.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core import redis_urls, validate
from ..core.keys import DEFAULT_PREFIX
from ..core.replication import check_replication
from ..exceptions import ConfigurationError
from ..kinds import registry

CONFLICT_POLICIES = ("skip", "retry", "raise")
BACKEND_DOWN_POLICIES = ("fail", "run")
#: The lock family (kinds/registry.py) a task takes in each ``lock_mode``, unless an option
#: with a ``kind`` (``lock_range``, ``lock_keys``, ``lock_limit``) selects another.
MODE_KINDS = {"exclusive": "lease", "read": "rw", "upgradable": "rw", "write": "rw"}
LOCK_MODES = tuple(MODE_KINDS)


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
    return value  # checked against the task's signature by task_keys.TaskKey


def _are_names(value: Any) -> bool:
    """A non-empty list or tuple of non-empty strings."""
    return (
        isinstance(value, (list, tuple))
        and bool(value)
        and all(isinstance(item, str) and item for item in value)
    )


def _range(value: Any, argument: str) -> tuple[str, str]:
    if not _are_names(value) or len(value) != 2:
        raise ConfigurationError(argument, f"must be two argument names, got {value!r}")
    return (value[0], value[1])


def _limit(value: Any, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(argument, f"must be an int >= 1, got {value!r}")
    return value


def _keys(value: Any, argument: str) -> Any:
    if callable(value):
        return value
    if _are_names(value):
        return tuple(value)
    raise ConfigurationError(
        argument, f"must be a list of key templates or a callable, got {value!r}"
    )


@dataclass(frozen=True)
class Option:
    """One task option, declared once: its built-in default, the checker its values go
    through (never None, which means unset), what it does (the documentation of
    SingletonTask's attribute), whether it has an app-wide setting too, and the lock family
    (kinds/registry.py) a task takes when it is set, if it selects one."""

    name: str
    default: Any
    check: Callable[[Any, str], Any]
    doc: str
    per_task_only: bool = False
    kind: str | None = None
    #: Its field of :class:`TaskLockOptions` when the option's own word would mislead there.
    field_name: str | None = None

    @property
    def field(self) -> str:
        """Its field of :class:`TaskLockOptions`: ``lock_lease`` -> ``lease``; ``lock_ttl``
        -> ``max_hold`` (the public option keeps its name; inside, a lock's ``ttl`` is its
        renewed lease, and this is the cap on one run's hold)."""
        return self.field_name or self.name.removeprefix("lock_")


#: Every task option, in the order SingletonTask documents them. Every ``lock_*`` attribute
#: must be one of these; the app settings, the checks, :class:`TaskLockOptions` and
#: SingletonTask's attributes follow from this list.
OPTIONS: tuple[Option, ...] = (
    Option(
        "lock_ttl",
        3600.0,
        validate.check_positive,
        "Hard cap in seconds on how long one run may hold its lock (default 3600).",
        field_name="max_hold",
    ),
    Option(
        "lock_lease",
        30.0,
        validate.check_positive,
        "Heartbeat-renewed lease in seconds: a dead worker frees the lock within it (default 30).",
    ),
    Option(
        "lock_key",
        None,
        _any,
        'None (task name + bound arguments), a format string such as ``"report:{day}"``, '
        "a list of argument names, or a callable ``(args, kwargs) -> str``.",
        per_task_only=True,
    ),
    Option(
        "lock_wait", 0.0, validate.check_wait, "Seconds a run waits for a busy lock (default 0)."
    ),
    Option(
        "lock_conflict",
        "skip",
        _choice(CONFLICT_POLICIES),
        'What a run that cannot get its lock does: "skip" (default), "retry" or "raise".',
    ),
    Option(
        "lock_retry_countdown",
        10.0,
        validate.check_delay,
        'Countdown in seconds of the retry that ``lock_conflict="retry"`` schedules (default 10).',
    ),
    Option(
        "lock_release_delay",
        0.0,
        validate.check_delay,
        "Seconds the key stays locked after the run ends (release delay; default 0).",
    ),
    Option(
        "lock_on_enqueue",
        False,
        _on_enqueue,
        "Also refuse duplicates at ``apply_async``/``delay`` (default False): True keeps the "
        'key locked from enqueue to the end of the run; "until_start" keeps at most one '
        'queued call, freed when it starts, beside the running one; "debounce" is '
        '"until_start" where a new call replaces the queued one.',
    ),
    Option(
        "lock_queue_ttl",
        300.0,
        validate.check_positive,
        "With ``lock_on_enqueue``: seconds a queued call keeps its claim, counted from when "
        "it may run (after its countdown or eta), so a purged or lost message stops "
        "deduplicating new calls (default 300).",
    ),
    Option(
        "lock_mode",
        "exclusive",
        _choice(LOCK_MODES),
        '"exclusive" (default), "read", "upgradable" or "write".',
    ),
    Option(
        "lock_range",
        None,
        _range,
        "Two argument names bounding a range lock on the resource named by ``lock_key``.",
        per_task_only=True,
        kind="range",
    ),
    Option(
        "lock_keys",
        None,
        _keys,
        "Key templates (or a callable) for a multi-key lock.",
        per_task_only=True,
        kind="multi",
    ),
    Option(
        "lock_limit",
        None,
        _limit,
        "At most this many runs at once per key (``lock_key``): a counting semaphore.",
        per_task_only=True,
        kind="semaphore",
    ),
    Option(
        "lock_backend_down",
        "fail",
        _choice(BACKEND_DOWN_POLICIES),
        'Redis unreachable: "fail" (default: raise LockBackendError) or "run" (run unlocked).',
    ),
)

#: option -> (built-in default, checker), from :data:`OPTIONS`.
TASK_OPTIONS: dict[str, tuple[Any, Callable[[Any, str], Any]]] = {
    option.name: (option.default, option.check) for option in OPTIONS
}

#: The options that select a lock family when set: (option, its TaskLockOptions field, family).
KIND_OPTIONS = tuple((option.name, option.field, option.kind) for option in OPTIONS if option.kind)

#: The lease a task gets when neither it nor the app sets one, unless ``lock_ttl`` is
#: shorter than three of them: then a third of ``lock_ttl``.
DEFAULT_LEASE: float = TASK_OPTIONS["lock_lease"][0]

#: Where an option's value came from when neither the task nor the app set it.
_BUILT_IN = "the default"


def setting_name(option: str) -> str:
    """``lock_ttl`` -> ``singleton_lock_ttl``."""
    return "singleton_lock_" + option.removeprefix("lock_")


#: Every app setting this package reads; any other ``singleton_lock_*`` key is a typo.
APP_SETTINGS = (
    "singleton_lock_url",
    "singleton_lock_prefix",
    "singleton_lock_client_kwargs",
    # Replicated locks (LockClient's replicas and replica_timeout).
    "singleton_lock_replicas",
    "singleton_lock_replica_timeout",
    # Tasks locked by name (celery/named_tasks.py): {name or glob: {lock_* option: value}}.
    "singleton_lock_tasks",
    # How long a call's done mark lasts (celery/done_marks.py).
    "singleton_lock_done_mark_ttl",
    # Where a call writes its done mark: "copies" (default) or "always".
    "singleton_lock_done_marks",
    *(setting_name(option.name) for option in OPTIONS if not option.per_task_only),
)


def check_lease_within_ttl(lease_from: str, lease: float, ttl_from: str, ttl: float) -> None:
    """An explicit lease longer than the ttl can never be renewed to its end: refuse it,
    naming where each value came from."""
    if lease > ttl:
        raise ConfigurationError(
            lease_from,
            f"bad configuration: lock_lease ({lease} s) must not exceed lock_ttl ({ttl} s, "
            f"from {ttl_from}); lower the lease or leave it unset (the default lease is "
            f"{DEFAULT_LEASE:g} s, or a third of a shorter lock_ttl)",
        )


def check_task_options(task_name: str, attrs: dict[str, Any]) -> None:
    """Reject unknown ``lock_*`` attributes and bad values where a task is declared."""
    for option, value in attrs.items():
        if not option.startswith("lock_"):
            continue
        if option not in TASK_OPTIONS:
            known = ", ".join(sorted(TASK_OPTIONS))
            raise ConfigurationError(
                f"{task_name}.{option}",
                f"unknown option{did_you_mean(option, TASK_OPTIONS)} (known options: {known})",
            )
        if value is not None:
            TASK_OPTIONS[option][1](value, f"{task_name}.{option}")


@dataclass(frozen=True)
class TaskLockOptions:
    """The resolved lock options of one task: a field per entry of :data:`OPTIONS`, in its
    order (typed here for the type checker; tests/tasks/test_task_config.py checks the two
    agree)."""

    max_hold: float
    lease: float
    key: Any
    wait: float
    conflict: str
    retry_countdown: float
    release_delay: float
    on_enqueue: bool | str
    queue_ttl: float
    mode: str
    range: tuple[str, str] | None
    keys: Any
    limit: int | None
    backend_down: str

    @classmethod
    def resolve(cls, task_name: str, task: Any, conf: Any) -> TaskLockOptions:
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for option in OPTIONS:
            # Static lookup: a callable lock_key stored on the class must not become a method.
            value = inspect.getattr_static(task, option.name, None)
            if isinstance(value, staticmethod):
                value = value.__func__
            where = f"{task_name}.{option.name}"
            if value is None and not option.per_task_only:
                where = setting_name(option.name)
                value = conf.get(where, None)
            if value is None:
                value, where = option.default, _BUILT_IN
            sources[option.name] = where
            values[option.field] = option.check(value, where) if value is not None else None
        if sources["lock_lease"] == _BUILT_IN:
            values["lease"] = min(DEFAULT_LEASE, values["max_hold"] / 3)
        else:
            check_lease_within_ttl(
                sources["lock_lease"], values["lease"], sources["lock_ttl"], values["max_hold"]
            )
        options = cls(**values)
        if options.on_enqueue and options.limit is not None:
            raise ConfigurationError(
                f"{task_name}.lock_on_enqueue",
                "cannot be combined with lock_limit (claims are exclusive single-key locks)",
            )
        if options.on_enqueue and options.kind() != "lease":
            raise ConfigurationError(
                f"{task_name}.lock_on_enqueue", "works with exclusive single-key locks only"
            )
        selected = [name for name, field, _ in KIND_OPTIONS if values[field] is not None]
        if len(selected) > 1:
            raise ConfigurationError(
                f"{task_name}.{selected[1]}", f"cannot be combined with {selected[0]}"
            )
        family = registry.family_named(options.kind())
        if options.mode not in family.modes:
            made_by = f"{selected[0]} makes" if selected else "makes"
            raise ConfigurationError(
                f"{task_name}.lock_mode",
                f"{made_by} a {family.family} lock, whose modes are {list(family.modes)}"
                f", not {options.mode!r}",
            )
        if math.isinf(options.wait) and options.conflict == "retry":
            raise ConfigurationError(
                f"{task_name}.lock_conflict", "'retry' makes no sense with an infinite lock_wait"
            )
        return options

    def kind(self, mode: str | None = None) -> str:
        """The lock family a run takes (``lease``, ``rw``, ``range``, ``multi``,
        ``semaphore``): the one the first set option with a ``kind`` selects, else the one
        of ``mode`` (default: the task's ``lock_mode``) in :data:`MODE_KINDS`."""
        for _, selecting, kind in KIND_OPTIONS:
            if getattr(self, selecting) is not None:
                return str(kind)
        return MODE_KINDS[mode or self.mode]


@dataclass(frozen=True)
class AppSettings:
    """App-wide settings: where the locks live, and how to connect there.

    ``url_setting`` names the setting the URL came from (``singleton_lock_url``, or
    ``broker_url`` when the locks share a Redis broker), for error messages;
    ``client_kwargs`` go to the redis-py client; ``replicas`` and ``replica_timeout`` to the
    :class:`LockClient` (replicated locks)."""

    url: str
    prefix: str
    url_setting: str = "singleton_lock_url"
    client_kwargs: dict[str, Any] = field(default_factory=dict)
    replicas: int = 0
    replica_timeout: float = 1.0

    def __repr__(self) -> str:
        from ..client import mask_password

        return (
            f"AppSettings(url={mask_password(self.url)!r}, prefix={self.prefix!r}, "
            f"client_kwargs={sorted(self.client_kwargs)}, "  # keys only: values hold secrets
            f"replicas={self.replicas}, replica_timeout={self.replica_timeout})"
        )

    @classmethod
    def for_app(cls, app: Any) -> AppSettings:
        """``from_conf(app.conf)``, checked once per app: later calls cost nothing."""
        settings: AppSettings | None = getattr(app, "_singleton_lock_settings", None)
        if settings is None:
            settings = cls.from_conf(app.conf)
            app._singleton_lock_settings = settings
        return settings

    @classmethod
    def from_conf(cls, conf: Any) -> AppSettings:
        """Read and check the ``singleton_lock_*`` settings of ``conf`` (no Redis call):
        a :class:`ConfigurationError` names the setting, says what is wrong and how to fix
        it."""
        check_setting_names(conf)
        check_setting_values(conf)
        url = conf.get("singleton_lock_url", None)
        url_setting = "singleton_lock_url"
        broker = conf.get("broker_url", None)
        if url is None:
            if not _is_broker_redis(broker):
                raise ConfigurationError(
                    "singleton_lock_url",
                    f"bad configuration: not set, and the broker ({_safe(broker)}) is not "
                    "Redis, so the locks need a Redis of their own: set singleton_lock_url "
                    "= 'redis://host:6379/0' (CELERY_SINGLETON_LOCK_URL in Django settings)",
                )
            url, url_setting = broker, "broker_url"
        if not isinstance(url, str) or not url:
            raise ConfigurationError(
                "singleton_lock_url",
                f"bad configuration: must be a Redis URL such as 'redis://host:6379/0', "
                f"got {url!r}",
            )
        client_kwargs: dict[str, Any] = {}
        if url == broker:
            # The lock Redis is the broker: connect to it the way Kombu does.
            url, client_kwargs = _broker_connection(url, conf)
        try:
            redis_urls.check_url(url)
        except ValueError as exc:
            raise ConfigurationError(
                url_setting, f"bad configuration: {_safe(url)}: {exc}"
            ) from None
        own = conf.get("singleton_lock_client_kwargs", None)
        if own is not None:
            if not isinstance(own, dict) or not all(isinstance(key, str) for key in own):
                raise ConfigurationError(
                    "singleton_lock_client_kwargs",
                    "bad configuration: must be a dict of redis-py client keyword "
                    f"arguments, such as {{'ssl_ca_certs': '/etc/ssl/ca.pem'}}, got {own!r}",
                )
            client_kwargs.update(own)
        prefix = conf.get("singleton_lock_prefix", None)
        if prefix is None:  # "" is a prefix too: no prefix, not the default one
            prefix = DEFAULT_PREFIX
        if not isinstance(prefix, str):
            raise ConfigurationError("singleton_lock_prefix", f"must be a str, got {prefix!r}")
        replicas, replica_timeout = _replication(conf)
        return cls(url, prefix, url_setting, client_kwargs, replicas, replica_timeout)


def _replication(conf: Any) -> tuple[int, float]:
    """The ``singleton_lock_replicas`` (default 0) and ``singleton_lock_replica_timeout``
    (default 1.0) settings of ``conf``, checked as :class:`LockClient` checks them."""
    replicas = conf.get("singleton_lock_replicas", None)
    replicas = 0 if replicas is None else replicas
    timeout = conf.get("singleton_lock_replica_timeout", None)
    timeout = 1.0 if timeout is None else timeout
    try:
        check_replication(replicas, timeout)
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"singleton_lock_{exc.argument}", f"bad configuration: {str(exc).partition(': ')[2]}"
        ) from None
    return replicas, float(timeout)


def _safe(url: Any) -> str:
    from ..client import mask_password

    return mask_password(url) if isinstance(url, str) else repr(url)


def check_setting_names(conf: Any) -> None:
    """Refuse a ``singleton_lock_*`` key this package does not read (a typo such as
    ``singleton_lock_tll`` would silently change nothing), however it is spelled: with
    Django's ``CELERY_`` namespace the keys keep their upper-case prefixed names."""
    # Listing the keys first: Celery loads a pending configuration (config_from_object)
    # only then, and until it has, ``conf.prefix`` reads None even with a namespace.
    keys = list(conf.keys())
    namespace = (getattr(conf, "prefix", None) or "").upper()
    unknown: dict[str, str] = {}  # key as spelled -> its name without the namespace
    for key in keys:
        if not isinstance(key, str):
            continue
        name = key.upper().removeprefix(namespace).lower()
        if name.startswith("singleton_lock_") and name not in APP_SETTINGS:
            unknown[key] = name
    if unknown:
        key = sorted(unknown)[0]
        # The suggestion spelled as the key was: CELERY_SINGLETON_LOCK_TTL in Django.
        spelled = key.isupper()
        choices = {
            (namespace + known.upper() if spelled else known): known for known in APP_SETTINGS
        }
        hint = did_you_mean(key if spelled else unknown[key], choices)
        raise ConfigurationError(
            key,
            f"bad configuration: unknown setting{hint} (known settings: {', '.join(APP_SETTINGS)})",
        )


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the known name closest to a misspelled ``word``, or
    ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""


#: How long a call's done mark lasts, in seconds (celery/done_marks.py).
DONE_MARK_TTL_SETTING = "singleton_lock_done_mark_ttl"


def check_done_mark_ttl(value: Any) -> float:
    """``singleton_lock_done_mark_ttl`` checked: a finite number of seconds >= 0 (0: no
    done marks, for a deployment whose messages never come back after a run started)."""
    try:
        return validate.check_delay(value, DONE_MARK_TTL_SETTING)
    except ConfigurationError as exc:
        problem = str(exc).partition(": ")[2]
        raise ConfigurationError(DONE_MARK_TTL_SETTING, f"bad configuration: {problem}") from None


#: Where a call writes its done mark (celery/done_marks.py): "copies" (the default) only
#: where a copy of its message can still come after it ended, "always" for every call.
DONE_MARKS_SETTING = "singleton_lock_done_marks"
DONE_MARKS_VALUES = ("copies", "always")


def check_done_marks(value: Any) -> str:
    """``singleton_lock_done_marks`` checked: one of :data:`DONE_MARKS_VALUES`."""
    try:
        return _choice(DONE_MARKS_VALUES)(value, DONE_MARKS_SETTING)
    except ConfigurationError as exc:
        problem = str(exc).partition(": ")[2]
        raise ConfigurationError(DONE_MARKS_SETTING, f"bad configuration: {problem}") from None


def check_setting_values(conf: Any) -> None:
    """Check every task-option setting the app sets, and that an app-wide lease fits in
    the app-wide ttl, so a bad value stops the worker at start rather than failing runs."""
    values: dict[str, Any] = {}
    for option in OPTIONS:
        if option.per_task_only:
            continue
        name = setting_name(option.name)
        value = conf.get(name, None)
        if value is not None:
            try:
                values[option.name] = option.check(value, name)
            except ConfigurationError as exc:
                problem = str(exc).partition(": ")[2]
                raise ConfigurationError(name, f"bad configuration: {problem}") from None
    done_mark_ttl = conf.get(DONE_MARK_TTL_SETTING, None)
    if done_mark_ttl is not None:
        check_done_mark_ttl(done_mark_ttl)
    done_marks = conf.get(DONE_MARKS_SETTING, None)
    if done_marks is not None:
        check_done_marks(done_marks)
    if "lock_lease" in values:
        ttl = values.get("lock_ttl", TASK_OPTIONS["lock_ttl"][0])
        ttl_from = "singleton_lock_ttl" if "lock_ttl" in values else _BUILT_IN
        check_lease_within_ttl("singleton_lock_lease", values["lock_lease"], ttl_from, ttl)


def broker_redis(conf: Any) -> tuple[str, dict[str, Any]] | None:
    """The URL and redis-py client keywords of the app's broker, connected to as Kombu
    connects (TLS, Sentinel master); None when the broker is not Redis."""
    broker = conf.get("broker_url", None)
    if not _is_broker_redis(broker):
        return None
    return _broker_connection(broker, conf)


def _is_broker_redis(broker: Any) -> bool:
    # A Sentinel broker names its master in transport options (Kombu) or in the URL.
    schemes = (*redis_urls.SINGLE_SCHEMES, *redis_urls.SENTINEL_SCHEMES)
    return isinstance(broker, str) and redis_urls.url_scheme(broker) in schemes


def _broker_connection(url: str, conf: Any) -> tuple[str, dict[str, Any]]:
    """The lock URL and client keywords for the broker's Redis: TLS from
    ``broker_use_ssl``, the Sentinel master and ``sentinel_kwargs`` from
    ``broker_transport_options``."""
    kwargs: dict[str, Any] = {}
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    use_ssl = conf.get("broker_use_ssl", None)
    if use_ssl and scheme != "unix":  # no TLS on a Unix socket
        if isinstance(use_ssl, dict):
            kwargs.update(use_ssl)
        # Kombu turns TLS on for a redis:// or sentinel:// broker with broker_use_ssl.
        tls = "rediss+sentinel"
        scheme = {"redis": "rediss", "sentinel": tls, "redis+sentinel": tls}.get(scheme, scheme)
    if scheme in redis_urls.SENTINEL_SCHEMES:
        options = conf.get("broker_transport_options", None)
        options = options if isinstance(options, dict) else {}
        master = options.get("master_name")
        if master and "master_name=" not in rest:
            rest += ("&" if "?" in rest else "?") + f"master_name={master}"
        sentinel_kwargs = options.get("sentinel_kwargs")
        if sentinel_kwargs is not None:
            kwargs["sentinel_kwargs"] = sentinel_kwargs
    return f"{scheme}://{rest}", kwargs
