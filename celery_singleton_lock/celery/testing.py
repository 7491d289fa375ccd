"""Helpers for testing your own locked tasks (the ``task_locks`` pytest fixture wraps them).

def test_report_is_skipped_while_locked(task_locks):
    with task_locks.hold(nightly_report, "2026-11-22"):
        result = nightly_report.apply(args=["2026-11-22"])
    task_locks.assert_skipped(result)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from ..client import mask_password
from ..core.handle import LockHandle
from ..exceptions import ConfigurationError
from .options import AppSettings
from .results import is_skipped


class TaskLocks:
    """Hold, inspect and assert on the locks of SingletonTask tasks.

    With ``test_redis_url`` (the ``task_locks`` fixture passes the test Redis), a task whose
    app sets no ``singleton_lock_url`` and whose broker is another Redis is refused with a
    :class:`ConfigurationError` before any Redis call: its locks would live in that broker,
    most likely a real one, and the test would write into it."""

    def __init__(self, *, test_redis_url: str | None = None) -> None:
        self.test_redis_url = test_redis_url

    @contextmanager
    def hold(self, task: Any, *args: Any, **kwargs: Any) -> Iterator[LockHandle]:
        """Hold, for the block, a lock that conflicts with every run of
        ``task(*args, **kwargs)`` (for read/write and range tasks: a write hold; for a
        ``lock_limit`` task: every permit, yielding the first)."""
        with ExitStack() as permits:
            handle = permits.enter_context(self._blocker(task, args, kwargs))
            for _ in range((task.lock_options.limit or 1) - 1):
                permits.enter_context(self._blocker(task, args, kwargs))
            yield handle

    def is_held(self, task: Any, *args: Any, **kwargs: Any) -> bool:
        """True if a run of ``task(*args, **kwargs)`` would find its lock taken (held, or
        in a release delay). Probes with a write hold taken and given back at once."""
        probe = self._blocker(task, args, kwargs)
        if probe.acquire(0):
            probe.release()
            return False
        return True

    def _blocker(self, task: Any, args: Any, kwargs: Any) -> LockHandle:
        self._check_app(task.app)
        mode = None if task.lock_options.mode == "exclusive" else "write"
        handle: LockHandle = task.make_lock(args, kwargs, mode=mode)
        return handle

    def _check_app(self, app: Any) -> None:
        conf = app.conf
        if self.test_redis_url is None or conf.get("singleton_lock_url", None):
            return
        url = AppSettings.from_conf(conf).url  # the broker's, as no lock URL is set
        if url != self.test_redis_url:
            raise ConfigurationError(
                "singleton_lock_url",
                f"app {app.main!r} sets none, so its locks would go to its broker"
                f" {mask_password(url)}, not the test Redis: merge the singleton_lock_config"
                " fixture into celery_config, use the singleton_lock_app fixture, or set"
                " singleton_lock_url (to lock_redis_url, or to this broker on purpose)",
            )

    @staticmethod
    def value(result: Any, timeout: float = 30.0) -> Any:
        """The return value of a task run: an ``AsyncResult``/``EagerResult`` or a value."""
        get = getattr(result, "get", None)
        if callable(get) and hasattr(result, "id"):
            return get(timeout=timeout)
        return result

    def assert_skipped(self, result: Any, timeout: float = 30.0) -> None:
        """Assert that the run was skipped because its lock was taken."""
        value = self.value(result, timeout)
        assert is_skipped(value), f"expected a skipped run, got {value!r}"

    def assert_ran(self, result: Any, timeout: float = 30.0) -> Any:
        """Assert that the run's body ran; returns its value."""
        value = self.value(result, timeout)
        assert not is_skipped(value), f"expected the body to run, but it was skipped: {value!r}"
        return value
