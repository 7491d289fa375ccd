"""What the worker apps ``worker_app.py`` and ``pool_app.py`` share: the app's settings (one
Redis for broker, results and locks, read from the environment the test sets) and the
records their tasks leave in that Redis for the test to poll.

``CSL_WORKER_REDIS_URL`` is the Redis, ``CSL_WORKER_PREFIX`` the lock key prefix (and the
prefix of the records), ``CSL_WORKER_QUEUE`` the default queue.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from celery import Celery

#: How long the records stay in Redis (every key the tests make expires).
RECORD_TTL = 600


def records_key(prefix: str) -> str:
    """The list of JSON records (one per event) of the tasks under ``prefix``."""
    return f"{prefix}runs"


def configured_app(main: str, url: str, prefix: str, queue: str) -> Celery:
    """An app with no tasks yet on the Redis at ``url``, its locks under ``prefix``."""
    app = Celery(main, set_as_current=False)
    app.conf.update(
        broker_url=url,
        result_backend=url,
        result_expires=RECORD_TTL,
        singleton_lock_url=url,
        singleton_lock_prefix=prefix,
        task_default_queue=queue,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
    )
    return app


def app_from_environment(make_app: Callable[[str, str, str], Celery]) -> Celery:
    """``make_app(url, prefix, queue)`` as the worker's environment says (a worker of an
    unset environment points at a port nothing listens on)."""
    return make_app(
        os.environ.get("CSL_WORKER_REDIS_URL", "redis://127.0.0.1:1/0"),
        os.environ.get("CSL_WORKER_PREFIX", "csltest:unset:"),
        os.environ.get("CSL_WORKER_QUEUE", "celery"),
    )


def record(task: Any, prefix: str, event: str, key: str | None, /, **fields: Any) -> None:
    """Append one event of the running ``task`` to the records of ``prefix``: its task id,
    the fencing token of the lock it holds, its pid and the server time, with ``fields``
    (which may override any of them)."""
    redis = task.lock_client.redis
    seconds, micros = redis.time()
    hold = task.lock
    entry = {
        "event": event,
        "key": key,
        "task_id": task.request.id,
        "token": hold.token if hold is not None else None,
        "pid": os.getpid(),
        "time": int(seconds) + int(micros) / 1_000_000,
        **fields,
    }
    pipe = redis.pipeline()
    pipe.rpush(records_key(prefix), json.dumps(entry))
    pipe.expire(records_key(prefix), RECORD_TTL)
    pipe.execute()


def busy_for(seconds: float) -> None:
    """Keep the run going ``seconds``, yielding every 20 ms (to the heartbeat thread, or to
    the other greenlets of a gevent or eventlet worker)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.02)
