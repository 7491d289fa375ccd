"""A task whose lock is cleared under it while it runs, as an admin clearing it would: the
events, metrics and run tests each watch what follows from it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery

from celery_singleton_lock import SingletonTask, lock_lost

TIMEOUT = 30


@contextmanager
def task_losing_its_lock(
    app: Celery, after_lost: Callable[[Any], object] | None = None
) -> Iterator[Any]:
    """A task of ``app`` on a 0.3 s lease whose run deletes its own lock key, waits until
    ``lock_lost`` is sent for it (the heartbeat finds the key gone), calls
    ``after_lost(task)`` if given, and returns "stopped early". Its receiver of ``lock_lost``
    is connected for the block."""
    lost = threading.Event()

    @app.task(base=SingletonTask, shared=False, bind=True, lock_lease=0.3)
    def long_job(self: Any) -> str:
        client = self.lock_client
        client.redis.delete(client.connection.keys(self.lock.name).lock)  # an admin cleared it
        assert lost.wait(TIMEOUT)
        if after_lost is not None:
            after_lost(self)
        return "stopped early"

    def on_lost(**_: Any) -> None:
        lost.set()

    lock_lost.connect(on_lost, sender=long_job, weak=False)
    try:
        yield long_job
    finally:
        lock_lost.disconnect(on_lost, sender=long_job)
