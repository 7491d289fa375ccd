"""What ``celery -A proj locks doctor`` learns from the Celery app: the facts of
:class:`..admin.doctor.AppFacts` (the checks themselves know no Celery, admin/doctor.py)."""

from __future__ import annotations

import logging
import math
from typing import Any

from ..admin.doctor import DEFAULT_VISIBILITY_TIMEOUT, AppFacts
from .app_client import lock_client_for
from .named_tasks import lock_named_tasks, named_tasks_setting
from .options import AppSettings, broker_redis

log = logging.getLogger("celery_singleton_lock.doctor")


def app_facts(app: Any, *, timeout: float) -> AppFacts:
    """The app's side of the doctor's checks: its settings, its SingletonTasks' leases and
    ``acks_late``, its broker's ``visibility_timeout`` and (``timeout`` > 0, remote control
    on) the node names of the workers that answer a ping within ``timeout`` seconds."""
    settings = AppSettings.for_app(app)
    if named_tasks_setting(app.conf):
        # The tasks singleton_lock_tasks names become SingletonTasks only when converted,
        # which a worker does at start: do it here too, to see their leases.
        lock_named_tasks(app)
    leases: dict[str, float] = {}
    acks_late: list[str] = []
    for name, task in sorted(app.tasks.items()):
        if getattr(type(task), "lock_options", None) is None:
            continue  # not a SingletonTask
        leases[name] = float(task.lock_options.lease)
        if task.acks_late:
            acks_late.append(name)
    visibility = None
    if broker_redis(app.conf) is not None:
        options = app.conf.broker_transport_options or {}
        visibility = float(options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT))
    remote_control = bool(app.conf.worker_enable_remote_control)
    return AppFacts(
        from_app=True,
        replicas=settings.replicas,
        socket_timeout=_socket_timeout(lock_client_for(app).redis),
        leases=leases,
        acks_late=tuple(acks_late),
        visibility_timeout=visibility,
        # Countdowns and etas are per call, known to no setting: the check says so.
        longest_countdown=None,
        workers=_workers(app, timeout) if timeout > 0 else None,
        remote_control=remote_control,
    )


def _socket_timeout(redis: Any) -> float | None:
    """The ``socket_timeout`` the app's lock client reads replies with (``math.inf``: none),
    or None when the client's pool cannot be read."""
    node = getattr(redis, "get_default_node", None)
    if node is not None:  # a Cluster: every node's pool is made with the same keywords
        redis = node().redis_connection
    pool = getattr(redis, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return None
    value = kwargs.get("socket_timeout")
    return math.inf if value is None else float(value)


def _workers(app: Any, timeout: float) -> list[str]:
    """One node name per ping reply: two workers of one name each answer under it."""
    try:
        replies = app.control.ping(timeout=timeout) or []
    except Exception as exc:  # broker unreachable: no worker evidence, not a failed doctor
        log.warning("could not ping the workers: %s", exc)
        return []
    return [name for reply in replies for name in reply]
