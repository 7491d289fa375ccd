"""The app's :class:`LockClient`: one per Celery app, made from its settings on first use.

Below the task and the worker step, which both need it (so neither imports the other for it).
"""

from __future__ import annotations

from typing import Any

from ..client import LockClient
from ..exceptions import ConfigurationError
from .options import AppSettings


def lock_client_for(app: Any) -> LockClient:
    """The app's :class:`LockClient` (one per app; safe across fork)."""
    client: LockClient | None = getattr(app, "_singleton_lock_client", None)
    if client is None:
        settings = AppSettings.for_app(app)
        try:
            client = LockClient.from_url(
                settings.url,
                prefix=settings.prefix,
                replicas=settings.replicas,
                replica_timeout=settings.replica_timeout,
                **settings.client_kwargs,
            )
        except ConfigurationError as exc:
            # The URL passed its checks: the client keywords are what it refused.
            raise ConfigurationError(
                "singleton_lock_client_kwargs",
                f"bad configuration: {str(exc).partition(': ')[2]}; it takes redis-py "
                "client keyword arguments only",
            ) from None
        # A database the server lacks is found at the first call, wherever that is (a task,
        # apply_async): the error then names the setting, not the client's argument.
        client.connection.url_argument = settings.url_setting
        app._singleton_lock_client = client
    return client


def use_lock_client(app: Any, client: LockClient) -> None:
    """Make ``client`` the app's :class:`LockClient`, in place of one made from its settings:
    a client on a Redis client of your own (your connection pool, retry policy, or a proxy in
    front of the server). Its tasks and worker lock through it until
    :func:`close_lock_client`, which closes it; a client the app had already is not closed."""
    if not isinstance(client, LockClient):
        raise ConfigurationError("client", f"must be a LockClient, not {type(client).__name__}")
    app._singleton_lock_client = client


def close_lock_client(app: Any) -> None:
    """Close the app's :class:`LockClient`, if it made one; the next lock makes a new one
    from the app's settings as they are then (test fixtures change them per test)."""
    client: LockClient | None = vars(app).pop("_singleton_lock_client", None)
    if client is not None:
        client.close()
