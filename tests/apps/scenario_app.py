"""The Celery app of the generative scenario check (tests/support/scenarios.py), run by real
``celery worker`` processes.

Three servers: the BROKER (``CSL_SC_BROKER_URL``: the evidence Redis itself, or RabbitMQ),
the EVIDENCE Redis (``CSL_SC_EVIDENCE_URL``: result backend and every record, never
touched by a fault) and the LOCK Redis (``CSL_SC_LOCK_URL``, behind a proxy that can hold a
reply back; the driver restarts it empty). ``CSL_SC_PREFIX`` prefixes the lock keys and the
records, ``CSL_SC_QUEUE`` is the default queue.

One task per lock kind of the matrix (``KIND_TASKS``), all with one signature
``(key, send, seconds, plan, lo, hi, other)``: ``send`` identifies one send of the driver
and is never part of the lock key, ``plan`` says which Celery feature the body exercises
(retry, autoretry, retry without throw, replace, a planned failure). Every body records its
``start`` and ``end`` (pid, task id, send, attempt, part, lock kind and what it locks) on the
evidence Redis, stamped with that server's clock; signals record each delivery's
``received``, ``outcome``, ``failure``, ``skipped`` and ``revoked``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery, Task
from celery.signals import task_failure, task_postrun, task_prerun, task_revoked

from celery_singleton_lock import LockBackendError, SingletonTask, lock_skipped

RECORD_TTL = 3600
#: Every task's lease: a holder SIGSTOPped longer than this loses its lock.
LEASE = 3.0
#: The Redis transport's visibility timeout: a body longer than this is delivered again
#: while it runs (the ``redelivery`` feature).
VISIBILITY_TIMEOUT = 4
RELEASE_DELAY = 1.0


class Flaky(Exception):
    """Raised by a body once, for ``autoretry_for``."""


class PlannedFailure(Exception):
    """A body's planned failure (the first send of a task id re-sent after it failed)."""


def events_key(prefix: str) -> str:
    return f"{prefix}events"


def server_time(client: Any) -> float:
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1_000_000


#: kind -> (task name, the options of its task). Every lock key leaves ``send`` out.
KEY = "sc:{key}"
KIND_OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "exclusive": ("sc.exclusive", {"lock_key": KEY}),
    "conflict_retry": (
        "sc.conflict_retry",
        {"lock_key": KEY, "lock_conflict": "retry", "lock_retry_countdown": 0.3},
    ),
    "conflict_raise": ("sc.conflict_raise", {"lock_key": KEY, "lock_conflict": "raise"}),
    "read": ("sc.read", {"lock_key": KEY, "lock_mode": "read"}),
    "write": ("sc.write", {"lock_key": KEY, "lock_mode": "write"}),
    "range": ("sc.range", {"lock_key": KEY, "lock_range": ("lo", "hi")}),
    "keys": ("sc.keys", {"lock_keys": ["sc:{key}", "sc:{other}"]}),
    "limit2": ("sc.limit2", {"lock_key": KEY, "lock_limit": 2}),
    "release_delay": ("sc.release_delay", {"lock_key": KEY, "lock_release_delay": RELEASE_DELAY}),
    "enqueue": ("sc.enqueue", {"lock_key": KEY, "lock_on_enqueue": True}),
    "until_start": ("sc.until_start", {"lock_key": KEY, "lock_on_enqueue": "until_start"}),
    "debounce": ("sc.debounce", {"lock_key": KEY, "lock_on_enqueue": "debounce"}),
}
#: Tasks a kind's scenario sends beside its own: shared range holds beside the range kind's
#: exclusive ones.
EXTRA_TASKS: dict[str, tuple[str, dict[str, Any]]] = {
    "sc.range_read": ("range", {"lock_key": KEY, "lock_range": ("lo", "hi"), "lock_mode": "read"}),
}
#: The task converted by ``singleton_lock_tasks`` (not a SingletonTask in its declaration).
NAMED_TASK = "sc.named"
NAMED_OPTIONS: dict[str, Any] = {"lock_key": KEY, "lock_lease": LEASE, "lock_ttl": 600}
TASK_KINDS = {name: kind for kind, (name, _) in KIND_OPTIONS.items()} | {NAMED_TASK: "named"}
TASK_KINDS |= {name: kind for name, (kind, _) in EXTRA_TASKS.items()}


class ThroughCall(Task):  # type: ignore[misc]
    """A task class of its own with a ``__call__``: the body notes whether it ran through
    it (a task converted by ``singleton_lock_tasks`` keeps its own methods, docs/tasks.md)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.request.through_call = True
        return super().__call__(*args, **kwargs)


def make_app(
    broker_url: str, evidence_url: str, lock_url: str, prefix: str, queue: str = "celery"
) -> Celery:
    app = Celery("scenario_app", set_as_current=False)
    app.conf.update(
        broker_url=broker_url,
        result_backend=evidence_url,
        result_expires=RECORD_TTL,
        singleton_lock_url=lock_url,
        singleton_lock_prefix=prefix,
        singleton_lock_tasks={NAMED_TASK: NAMED_OPTIONS},
        task_default_queue=queue,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        broker_transport_options={
            "visibility_timeout": VISIBILITY_TIMEOUT,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
            "unacked_mutex_expire": 2,
        },
    )
    records = redis.Redis.from_url(evidence_url)

    def record(event: str, **fields: Any) -> None:
        entry = {"event": event, "pid": os.getpid(), "time": server_time(records), **fields}
        pipe = records.pipeline()
        pipe.rpush(events_key(prefix), json.dumps(entry))
        pipe.expire(events_key(prefix), RECORD_TTL)
        pipe.execute()

    def body(
        task: Any, key: str, send: str, seconds: float, plan: dict[str, Any] | None,
        lo: int, hi: int, other: str,
    ) -> dict[str, Any]:  # fmt: skip
        plan = plan or {}
        request = task.request
        attempt = request.retries or 0
        run = {
            "task_id": request.id,
            "send": send,
            "attempt": attempt,
            "part": "replacement" if plan.get("replaced") else "main",
            "kind": TASK_KINDS[task.name],
            "task": task.name,
            "key": key,
            "lo": lo,
            "hi": hi,
            "other": other,
            "worker": request.hostname,
            "through_call": bool(getattr(request, "through_call", False)),
            "token": getattr(getattr(task, "lock", None), "token", None),
        }
        record("start", **run)
        if plan.get("retry_nothrow") and attempt < 1:
            task.retry(countdown=0.3, throw=False)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.01)
        record("end", **run)
        if plan.get("fail"):
            raise PlannedFailure(send)
        if plan.get("retry") and attempt < 1:
            raise task.retry(countdown=0.3)
        if plan.get("autoretry") and attempt < 1:
            raise Flaky(send)
        if plan.get("replace") and not plan.get("replaced"):
            kwargs = {"seconds": seconds, "plan": {"replaced": True}, "lo": lo, "hi": hi}
            raise task.replace(task.signature((key,), {**kwargs, "send": send, "other": other}))
        return {"send": send, "pid": os.getpid(), "attempt": attempt}

    common: dict[str, Any] = {
        "bind": True, "shared": False, "acks_late": True, "reject_on_worker_lost": True,
        "max_retries": 30, "autoretry_for": (LockBackendError, Flaky),
        "default_retry_delay": 0.3,
    }  # fmt: skip

    def declare(name: str, options: dict[str, Any], base: Any) -> None:
        @app.task(name=name, base=base, **common, **options)
        def task(
            self: Any, key: str, send: str, seconds: float = 0.5,
            plan: dict[str, Any] | None = None, lo: int = 0, hi: int = 0, other: str = "",
        ) -> dict[str, Any]:  # fmt: skip
            return body(self, key, send, seconds, plan, lo, hi, other)

    tasks = [*KIND_OPTIONS.values(), *((name, opts) for name, (_, opts) in EXTRA_TASKS.items())]
    for name, options in tasks:
        declare(name, {"lock_lease": LEASE, "lock_ttl": 600, **options}, SingletonTask)
    declare(NAMED_TASK, {}, ThroughCall)

    @app.task(name="sc.collect", bind=True, shared=False)
    def collect(self: Any, results: Any, send: str) -> dict[str, Any]:
        """A chord's callback: records what the members returned."""
        record("collected", task_id=self.request.id, send=send, results=results)
        return {"send": send, "results": results}

    def ours(sender: Any) -> bool:
        return getattr(sender, "app", None) is app

    def send_of(kwargs: Any) -> Any:
        """The driver passes ``send`` by keyword."""
        return (kwargs or {}).get("send")

    @task_prerun.connect(weak=False)
    def on_prerun(sender: Any = None, task_id: str = "", kwargs: Any = None, **_: Any) -> None:
        if ours(sender):
            record("received", task_id=task_id, send=send_of(kwargs), task=sender.name)

    @task_postrun.connect(weak=False)
    def on_postrun(
        sender: Any = None, task_id: str = "", state: Any = None, kwargs: Any = None, **_: Any
    ) -> None:
        if ours(sender):
            record("outcome", task_id=task_id, send=send_of(kwargs), state=str(state))

    @task_failure.connect(weak=False)
    def on_failure(
        sender: Any = None, task_id: str = "", exception: Any = None, kwargs: Any = None,
        **_: Any,
    ) -> None:  # fmt: skip
        if ours(sender):
            record(
                "failure", task_id=task_id, send=send_of(kwargs),
                exception=type(exception).__name__, message=str(exception)[:300],
            )  # fmt: skip

    @task_revoked.connect(weak=False)
    def on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
        if ours(sender):
            kwargs = getattr(request, "kwargs", None)
            record("revoked", task_id=getattr(request, "id", None), send=send_of(kwargs))

    @lock_skipped.connect(weak=False)
    def on_skipped(sender: Any, name: str, task_id: str, holder: Any, **_: Any) -> None:
        if ours(sender):
            request = sender.request
            record(
                "skipped", task_id=task_id, send=send_of(request.kwargs), name=name,
                holder=holder, attempt=request.retries or 0,
            )  # fmt: skip

    return app


app = make_app(
    os.environ.get("CSL_SC_BROKER_URL", "redis://127.0.0.1:1/0"),
    os.environ.get("CSL_SC_EVIDENCE_URL", "redis://127.0.0.1:1/0"),
    os.environ.get("CSL_SC_LOCK_URL", "redis://127.0.0.1:1/0"),
    os.environ.get("CSL_SC_PREFIX", "csltest:unset:"),
    os.environ.get("CSL_SC_QUEUE", "celery"),
)
