"""The Celery app that ``tests/tasks/test_task_workers.py`` runs in real ``celery worker``
processes.

``celery -A worker_app worker`` reads its configuration from the environment the test sets
(see ``recording.py``). The test process builds a twin of the app with :func:`make_app` to
send the same tasks.

Every task records what it did in the test Redis: one JSON entry per event on the list
``<prefix>runs`` (``start``, ``end``, ``retry``, and ``released``/``skipped`` from our
signals), with the server time of the event, the fencing token, the pid and the worker's
node name. Nothing here sleeps to synchronise with the test: the test polls these records.
"""

from __future__ import annotations

import signal
import time
from typing import Any

from celery import Celery

from celery_singleton_lock import SingletonTask, lock_released, lock_skipped

from .recording import RECORD_TTL, app_from_environment, busy_for, configured_app, records_key
from .recording import record as record_event

__all__ = ["app", "make_app", "records_key", "ticks_key"]


def ticks_key(prefix: str, key: str) -> str:
    return f"{prefix}ticks:{key}"


def make_app(url: str, prefix: str, queue: str = "celery") -> Celery:
    """The app, with its tasks: every lock name is ``job:<key>``, shared by all tasks."""
    app = configured_app("worker_app", url, prefix, queue)

    def record(task: Any, event: str, key: str | None, **fields: Any) -> None:
        request = task.request
        extra = {"task": task.name, "retries": request.retries or 0, "worker": request.hostname}
        record_event(task, prefix, event, key, **extra, **fields)

    def hold(task: Any, key: str, seconds: float) -> int | None:
        record(task, "start", key)
        busy_for(seconds)
        record(task, "end", key)
        held = task.lock
        return held.token if held is not None else None

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="worker_app.short_lease",
        lock_key="job:{key}", lock_lease=2, lock_ttl=3600, lock_wait=30,
    )  # fmt: skip
    def short_lease(self: Any, key: str, seconds: float) -> int | None:
        """A 2 s lease (heartbeat-renewed) under a one-hour cap; waits up to 30 s for it."""
        return hold(self, key, seconds)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="worker_app.long_lease",
        lock_key="job:{key}", lock_lease=60, lock_ttl=3600,
    )  # fmt: skip
    def long_lease(self: Any, key: str, seconds: float) -> int | None:
        """A 60 s lease: if it is freed within seconds, somebody released it."""
        return hold(self, key, seconds)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="worker_app.long_read",
        lock_key="job:{key}", lock_mode="read", lock_lease=60, lock_ttl=3600,
    )  # fmt: skip
    def long_read(self: Any, key: str, seconds: float) -> int | None:
        """A read hold of the reader-writer lock of the key, on a 60 s lease."""
        return hold(self, key, seconds)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="worker_app.long_write",
        lock_key="job:{key}", lock_mode="write", lock_lease=60, lock_ttl=3600,
    )  # fmt: skip
    def long_write(self: Any, key: str, seconds: float) -> int | None:
        """The writer of the reader-writer lock of the key: excluded by any reader."""
        return hold(self, key, seconds)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="worker_app.long_range",
        lock_key="job:{key}", lock_range=("lo", "hi"), lock_lease=60, lock_ttl=3600,
    )  # fmt: skip
    def long_range(self: Any, key: str, lo: float, hi: float, seconds: float) -> int | None:
        """A write hold on [lo, hi] of the range lock of the key, on a 60 s lease."""
        return hold(self, key, seconds)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="worker_app.long_multi",
        lock_keys=["job:{key}", "job:{other}"], lock_lease=60, lock_ttl=3600,
    )  # fmt: skip
    def long_multi(self: Any, key: str, other: str, seconds: float) -> int | None:
        """Leases on both keys at once (a multi-key lock), on a 60 s lease."""
        return hold(self, key, seconds)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="worker_app.long_permit",
        lock_key="job:{key}", lock_limit=1, lock_lease=60, lock_ttl=3600,
    )  # fmt: skip
    def long_permit(self: Any, key: str, seconds: float) -> int | None:
        """The one permit of the semaphore of the key, on a 60 s lease."""
        return hold(self, key, seconds)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="worker_app.waiter",
        lock_key="job:{key}", lock_lease=60, lock_ttl=3600, lock_wait=60,
    )  # fmt: skip
    def waiter(self: Any, key: str, seconds: float) -> int | None:
        """Waits up to a minute for the lock, then holds it ``seconds``. Its start record
        notes how many ticks ``ticker`` runs of the key had made by then."""
        redis = self.lock_client.redis
        ticks = int(redis.get(ticks_key(prefix, key)) or 0)
        record(self, "start", key, ticks=ticks)
        busy_for(seconds)
        record(self, "end", key)
        return int(self.lock.token)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="worker_app.ticker",
        lock_key="job:{key}", lock_lease=60, lock_ttl=3600,
    )  # fmt: skip
    def ticker(self: Any, key: str, seconds: float, ignore_sigterm: bool = False) -> None:
        """Counts in Redis as fast as it can while it runs (and in its ``finally``): any tick
        made after another run of the key started means the two overlapped. With
        ``ignore_sigterm`` it behaves like a process stuck in C code: only SIGKILL ends it
        (the pool replaces the child afterwards, so the setting dies with it)."""
        if ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        redis = self.lock_client.redis
        counter = ticks_key(prefix, key)
        redis.pipeline().incr(counter).expire(counter, RECORD_TTL).execute()
        record(self, "start", key)
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                redis.incr(counter)
        finally:
            redis.incr(counter)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="worker_app.flaky",
        lock_key="job:{key}", lock_lease=60, lock_ttl=3600, max_retries=3,
    )  # fmt: skip
    def flaky(self: Any, key: str, retry_queue: str) -> int:
        """Retries once, with countdown=1, on ``retry_queue``; the retried run returns its
        attempt number."""
        record(self, "start", key)
        if not self.request.retries:
            record(self, "retry", key)
            raise self.retry(countdown=1, queue=retry_queue)
        record(self, "end", key)
        return int(self.request.retries)

    def on_released(sender: Any, name: str, hold: Any, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            record(sender, "released", name.removeprefix("job:"), released_token=hold.token)

    def on_skipped(sender: Any, name: str, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            record(sender, "skipped", name.removeprefix("job:"))

    lock_released.connect(on_released, weak=False)
    lock_skipped.connect(on_skipped, weak=False)
    return app


app = app_from_environment(make_app)
