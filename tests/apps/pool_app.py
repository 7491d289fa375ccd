"""The Celery app that ``tests/tasks/test_pools.py`` runs in ``celery worker -P <pool>`` processes.

Configured from the environment like ``worker_app.py`` (see ``recording.py``). Every lock
name is ``pool:<key>``, on a 2 s lease under a one-hour cap, so a lock that is not renewed is
gone within seconds.

Each task records ``start`` and ``end`` (and ``released``/``lost`` from our signals) on the
list ``<prefix>runs``, with the server time, the fencing token, the pid and the thread or
greenlet it ran on. Nothing here sleeps to synchronise with the test: ``gated`` holds its lock
until the test sets the key ``<prefix>gate:<key>``, and the test polls the records.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from celery import Celery

from celery_singleton_lock import SingletonTask, lock_lost, lock_released

from .recording import RECORD_TTL, app_from_environment, busy_for, configured_app, records_key
from .recording import record as record_event

#: The lease of every task here, seconds.
LEASE = 2.0
#: The hard time limit of ``stuck``, seconds.
STUCK_LIMIT = 2.0

__all__ = ["LEASE", "RECORD_TTL", "app", "gate_key", "make_app", "records_key"]


def gate_key(prefix: str, key: str) -> str:
    return f"{prefix}gate:{key}"


def make_app(url: str, prefix: str, queue: str = "celery") -> Celery:
    """The app, with its tasks."""
    app = configured_app("pool_app", url, prefix, queue)

    def record(task: Any, event: str, key: str, **fields: Any) -> None:
        record_event(task, prefix, event, key, thread=threading.get_ident(), **fields)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="pool_app.hold",
        lock_key="pool:{key}", lock_lease=LEASE, lock_ttl=3600, lock_wait=60,
    )  # fmt: skip
    def hold(self: Any, key: str, seconds: float) -> int:
        """Waits up to a minute for the lock, then holds it ``seconds`` (yielding)."""
        record(self, "start", key)
        busy_for(seconds)
        record(self, "end", key)
        return int(self.lock.token)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="pool_app.gated",
        lock_key="pool:{key}", lock_lease=LEASE, lock_ttl=3600,
    )  # fmt: skip
    def gated(self: Any, key: str) -> int:
        """Holds the lock until the test sets the gate of ``key`` (polls, yielding)."""
        redis = self.lock_client.redis
        record(self, "start", key)
        try:
            while not redis.exists(gate_key(prefix, key)):
                time.sleep(0.02)
        finally:
            record(self, "end", key)
        return int(self.lock.token)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="pool_app.queued",
        lock_key="pool:{key}", lock_lease=LEASE, lock_ttl=3600, lock_wait=30,
        lock_on_enqueue="until_start",
    )  # fmt: skip
    def queued(self: Any, key: str) -> int:
        """As ``gated``, with one call at a time let into the queue (``until_start``) and up
        to 30 s of waiting in the worker for the run lock."""
        redis = self.lock_client.redis
        record(self, "start", key)
        try:
            while not redis.exists(gate_key(prefix, key)):
                time.sleep(0.02)
        finally:
            record(self, "end", key)
        return int(self.lock.token)

    def stuck_body(self: Any, key: str) -> int:
        """Its first delivery is stuck until its hard time limit kills it, deaf to SIGTERM as
        a body blocked in C code is (the pool then kills it 0.1 s later); the message is
        delivered again (``acks_late``, not acknowledged on timeout), and that copy returns."""
        redis = self.lock_client.redis
        deliveries = f"{prefix}deliveries:{self.request.id}"
        count = int(redis.incr(deliveries))
        redis.expire(deliveries, RECORD_TTL)
        record(self, "start", key, delivery=count)
        if count == 1:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(0.02)
        record(self, "end", key, delivery=count)
        return int(self.lock.token)

    stuck_options: dict[str, Any] = {
        "lock_key": "pool:{key}", "lock_lease": LEASE, "lock_ttl": 3600,
        "time_limit": STUCK_LIMIT, "acks_late": True, "reject_on_worker_lost": True,
        "acks_on_failure_or_timeout": False,
    }  # fmt: skip
    app.task(base=SingletonTask, bind=True, shared=False, name="pool_app.stuck", **stuck_options)(
        stuck_body
    )
    # The same with a release delay: the killed first delivery did not end, so it leaves none
    # in the way of its own message coming back.
    app.task(
        base=SingletonTask, bind=True, shared=False, name="pool_app.stuck_release_delay",
        lock_release_delay=600, **stuck_options,
    )(stuck_body)  # fmt: skip

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="pool_app.spin",
        lock_key="pool:{key}", lock_lease=LEASE, lock_ttl=3600,
    )  # fmt: skip
    def spin(self: Any, key: str, seconds: float, yield_every: float = 0.0) -> int:
        """CPU-bound: computes for ``seconds`` without a blocking call, so under gevent or
        eventlet nothing else in the process runs meanwhile; with ``yield_every`` it pauses
        for a millisecond that often (``time.sleep`` is ``gevent.sleep`` / ``eventlet.sleep``
        once the worker has patched the standard library). Not ``sleep(0)``: under gevent
        that runs no timer, so the heartbeat, waiting on one, would still not run."""
        record(self, "start", key)
        deadline = time.monotonic() + seconds
        next_yield = time.monotonic() + yield_every
        count = 0
        while (now := time.monotonic()) < deadline:
            count += 1
            if yield_every and now >= next_yield:
                time.sleep(0.001)
                next_yield = now + yield_every
        record(self, "end", key, lost=self.lock.lost)
        return count

    def on_released(sender: Any, name: str, hold: Any, task_id: str, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            record(sender, "released", name.removeprefix("pool:"), released_token=hold.token)

    def on_lost(sender: Any, name: str, hold: Any, task_id: str, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            # Sent from the heartbeat, not from the run: the run's id comes with the signal.
            record(sender, "lost", name.removeprefix("pool:"), task_id=task_id)

    lock_released.connect(on_released, weak=False)
    lock_lost.connect(on_lost, weak=False)
    return app


app = app_from_environment(make_app)
