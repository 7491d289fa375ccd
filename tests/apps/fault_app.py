"""The Celery app that the outage and chaos tests run in real ``celery worker`` processes.

Two Redis servers: the LOCK server (``CSL_FAULT_LOCK_URL``, ``singleton_lock_url``), which
the tests stop and restart empty, and the BROKER server (``CSL_FAULT_BROKER_URL``: broker,
and where every record and the fenced store live), which they never touch, so that what the
tasks record survives the lock server's restarts. ``CSL_FAULT_PREFIX`` is the lock key prefix
and the prefix of every record key; ``CSL_FAULT_QUEUE`` the default queue.

Every event is one JSON entry on the list ``<prefix>events`` on the broker server, stamped
with that server's clock, so the test, the chaos driver and every worker share one clock.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import redis
from celery import Celery
from celery.backends.redis import RedisBackend
from celery.signals import task_postrun, task_prerun

from celery_singleton_lock import (
    LockBackendError,
    LockError,
    LockLost,
    SingletonTask,
    lock_lost,
    lock_skipped,
)

#: Every record key expires.
RECORD_TTL = 3600
#: The chaos tasks' lease: a holder SIGSTOPped longer than this loses its lock.
CHAOS_LEASE = 3.0
#: ``fault.dies_before_result_delayed``'s release delay: longer than the re-queue (half the
#: 8 s visibility timeout) of a copy that finds its call ended with no outcome stored.
RESULT_RELEASE_DELAY = 10.0
#: The chaos tasks: ``fault.chaos`` waits and retries until it runs, ``fault.chaos_skip`` is
#: skipped while another call runs its key.
CHAOS_TASKS = ("fault.chaos", "fault.chaos_skip")

#: The fencing recipe of docs/fencing.md, with a log: KEYS[1] the store hash of one key,
#: KEYS[2] the log of accepted writes, KEYS[3] the log of rejected ones.
#: ARGV: token, execution id, operation. Rejects a token older than the last accepted one
#: (an equal one is accepted: one holder writes twice). Returns {1|0, server time}.
FENCED_WRITE = """
local t = redis.call('TIME')
local now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
local entry = ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. now
local last = redis.call('HGET', KEYS[1], 'fence_token')
if last and tonumber(last) > tonumber(ARGV[1]) then
  redis.call('RPUSH', KEYS[3], entry)
  redis.call('EXPIRE', KEYS[3], ARGV[4])
  return {0, now}
end
redis.call('HSET', KEYS[1], 'fence_token', ARGV[1], 'execution', ARGV[2], 'op', ARGV[3])
redis.call('RPUSH', KEYS[2], entry)
for i = 1, 2 do
  redis.call('EXPIRE', KEYS[i], ARGV[4])
end
return {1, now}
"""


def events_key(prefix: str) -> str:
    return f"{prefix}events"


def gate_key(prefix: str, key: str) -> str:
    """The key whose existence lets ``fault.gated`` runs of ``key`` end."""
    return f"{prefix}gate:{key}"


def store_keys(prefix: str, key: str) -> list[str]:
    """The fenced store of ``key``: its hash, accepted log and rejected log."""
    return [f"{prefix}store:{key}", f"{prefix}accepted:{key}", f"{prefix}rejected:{key}"]


def server_time(client: Any) -> float:
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1_000_000


def make_app(lock_url: str, broker_url: str, prefix: str, queue: str = "celery") -> Celery:
    app = Celery("fault_app", set_as_current=False)
    app.conf.update(
        broker_url=broker_url,
        result_backend=broker_url,
        result_expires=RECORD_TTL,
        singleton_lock_url=lock_url,
        singleton_lock_prefix=prefix,
        task_default_queue=queue,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        # Killed runs come back (a child killed: at once; a whole worker: once its unacked
        # messages are visible again), so that every chaos run completes in the end.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        broker_transport_options={
            "visibility_timeout": 8,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
            # Kombu restores unacked messages under a mutex key that lives 300 s by default;
            # a worker SIGKILLed while holding it would stop every restore for that long.
            "unacked_mutex_expire": 2,
        },
    )
    records = redis.Redis.from_url(broker_url)
    fenced = records.register_script(FENCED_WRITE)

    def record(event: str, **fields: Any) -> None:
        entry = {"event": event, "pid": os.getpid(), "time": server_time(records), **fields}
        pipe = records.pipeline()
        pipe.rpush(events_key(prefix), json.dumps(entry))
        pipe.expire(events_key(prefix), RECORD_TTL)
        pipe.execute()

    def task_record(task: Any, event: str, key: str, **fields: Any) -> None:
        hold = task.lock
        record(
            event,
            key=key,
            task=task.name,
            task_id=task.request.id,
            token=hold.token if hold is not None else None,
            **fields,
        )

    def hold_until_lost(task: Any, key: str, seconds: float) -> dict[str, Any]:
        """Hold the key for ``seconds`` or until the lock is found lost (by the heartbeat:
        ``self.lock.lost``, then ``check()`` says why)."""
        task_record(task, "start", key)
        deadline = time.monotonic() + seconds
        hold = task.lock
        outcome: dict[str, Any] = {"locked": hold is not None, "lost": None}
        while time.monotonic() < deadline:
            if hold is not None and hold.lost:
                try:
                    hold.check()
                except LockLost as exc:
                    outcome["lost"] = exc.reason
                break
            time.sleep(0.02)
        task_record(task, "end", key, lost=outcome["lost"])
        outcome["token"] = hold.token if hold is not None else None
        return outcome

    # -- outage tasks -----------------------------------------------------------------------

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="fault.hold",
        lock_key="job:{key}", lock_lease=3, lock_ttl=600,
    )  # fmt: skip
    def hold(self: Any, key: str, seconds: float) -> dict[str, Any]:
        return hold_until_lost(self, key, seconds)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="fault.hold_or_run",
        lock_key="job:{key}", lock_lease=3, lock_ttl=600, lock_backend_down="run",
    )  # fmt: skip
    def hold_or_run(self: Any, key: str, seconds: float) -> dict[str, Any]:
        return hold_until_lost(self, key, seconds)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="fault.wait_hold",
        lock_key="job:{key}", lock_lease=3, lock_ttl=600, lock_wait=60,
    )  # fmt: skip
    def wait_hold(self: Any, key: str, seconds: float) -> dict[str, Any]:
        return hold_until_lost(self, key, seconds)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="fault.retrying",
        lock_key="job:{key}", lock_lease=3, lock_ttl=600, max_retries=None,
        autoretry_for=(LockBackendError,), default_retry_delay=0.3,
    )  # fmt: skip
    def retrying(self: Any, key: str, seconds: float) -> dict[str, Any]:
        """Lock Redis down: retried (autoretry_for) until it is back."""
        return {**hold_until_lost(self, key, seconds), "retries": self.request.retries}

    def gated_run(task: Any, key: str, seconds: float) -> dict[str, Any]:
        """Run until the test opens the gate of ``key`` (or ``seconds`` pass)."""
        task_record(task, "start", key)
        deadline = time.monotonic() + seconds
        while not records.exists(gate_key(prefix, key)) and time.monotonic() < deadline:
            time.sleep(0.02)
        task_record(task, "end", key)
        return {"locked": task.lock is not None, "pid": os.getpid()}

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="fault.gated",
        lock_key="gated:{key}", lock_lease=30, lock_ttl=600,
    )  # fmt: skip
    def gated(self: Any, key: str, seconds: float) -> dict[str, Any]:
        """Runs until the test opens the gate of ``key`` (or ``seconds`` pass), on a lease
        longer than the broker's visibility timeout: a killed run's message comes back while
        its hold still stands."""
        return gated_run(self, key, seconds)

    @app.task(
        base=SingletonTask, bind=True, shared=False, name="fault.gated_read",
        lock_key="gated_read:{key}", lock_lease=30, lock_ttl=600, lock_mode="read",
    )  # fmt: skip
    def gated_read(self: Any, key: str, seconds: float) -> dict[str, Any]:
        """``fault.gated`` under a read hold, which other calls share: the broker delivers
        a run's message again (its visibility timeout passed), and that copy must still not
        run beside it."""
        return gated_run(self, key, seconds)

    class DiesBeforeStoring(RedisBackend):  # type: ignore[misc]
        """Kills its process the first time it is asked to store a call's result: the body
        ended, its outcome is not stored yet."""

        def mark_as_done(self, task_id: str, *args: Any, **kwargs: Any) -> Any:
            if records.set(f"{prefix}died-storing:{task_id}", 1, nx=True, ex=RECORD_TTL):
                os.kill(os.getpid(), signal.SIGKILL)
            return super().mark_as_done(task_id, *args, **kwargs)

    dies_options: dict[str, Any] = {
        "base": SingletonTask, "bind": True, "shared": False, "lock_lease": 2, "lock_ttl": 600,
        "acks_late": True, "reject_on_worker_lost": True,
        "backend": DiesBeforeStoring(app=app, url=broker_url),
    }  # fmt: skip

    @app.task(name="fault.dies_before_result", lock_key="result:{key}", **dies_options)
    def dies_before_result(self: Any, key: str) -> int:
        """Its first run's process is killed between the body's end and the storing of its
        result; the call must still complete."""
        task_record(self, "start", key)
        task_record(self, "end", key)
        return os.getpid()

    @app.task(
        name="fault.dies_before_result_delayed", lock_key="delayed:{key}",
        lock_release_delay=RESULT_RELEASE_DELAY, **dies_options,
    )  # fmt: skip
    def dies_before_result_delayed(self: Any, key: str) -> int:
        """As ``fault.dies_before_result``, with a release delay: the first run's delay
        still stands when its copy, re-queued once for the missing outcome, comes back."""
        task_record(self, "start", key)
        task_record(self, "end", key)
        return os.getpid()

    # -- the chaos tasks --------------------------------------------------------------------

    def fenced_run(task: Any, key: str, seconds: float) -> int:
        """One run: a fenced ``begin`` write, work, a fenced ``commit`` write (made whether
        or not the hold was lost meanwhile, as a write already under way would be). Its
        start and end are recorded with the call's task id, the run's fencing token, worker,
        pid and attempt."""
        request, hold = task.request, task.lock
        token = int(hold.token)
        execution = f"{request.id}/{request.retries or 0}/{os.getpid()}/{token}"
        run = {
            "execution": execution,
            "worker": request.hostname,
            "attempt": request.retries or 0,
            "redelivered": bool((request.delivery_info or {}).get("redelivered")),
        }
        task_record(task, "start", key, **run)
        keys = store_keys(prefix, key)
        begun, begin_at = fenced(keys=keys, args=[token, execution, "begin", RECORD_TTL])
        committed, commit_at = 0, None
        if begun:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(0.01)
            committed, commit_at = fenced(keys=keys, args=[token, execution, "commit", RECORD_TTL])
        task_record(
            task, "end", key, **run, begun=bool(begun), committed=bool(committed),
            lost=hold.lost, begin_at=float(begin_at),
            commit_at=None if commit_at is None else float(commit_at),
        )  # fmt: skip
        return token

    # Configured as users configure a task that must not be lost: a message is acknowledged
    # after its run (a run killed is redelivered), and an unreachable lock Redis is retried
    # with a backoff short enough for the chaos run to drain.
    chaos_options: dict[str, Any] = {
        "base": SingletonTask, "bind": True, "shared": False, "lock_lease": CHAOS_LEASE,
        "lock_ttl": 600, "lock_key": "chaos:{key}", "max_retries": None, "acks_late": True,
        "reject_on_worker_lost": True, "autoretry_for": (LockBackendError,),
        "retry_backoff": True, "retry_backoff_max": 2,
    }  # fmt: skip

    @app.task(
        name="fault.chaos", lock_wait=15, lock_conflict="retry", lock_retry_countdown=0.2,
        **chaos_options,
    )  # fmt: skip
    def chaos(self: Any, key: str, seconds: float) -> int:
        """A call that must run: waits for the key, retries while it is taken."""
        return fenced_run(self, key, seconds)

    @app.task(name="fault.chaos_skip", lock_wait=1, lock_conflict="skip", **chaos_options)
    def chaos_skip(self: Any, key: str, seconds: float) -> int:
        """A call that is skipped (``lock_skipped``) while another run holds the key."""
        return fenced_run(self, key, seconds)

    def chaos_task(sender: Any) -> bool:
        return getattr(sender, "app", None) is app and sender.name in CHAOS_TASKS

    @task_prerun.connect(weak=False)
    def on_prerun(sender: Any = None, task_id: str = "", **_: Any) -> None:
        if chaos_task(sender):
            record("received", task_id=task_id, worker=sender.request.hostname)

    @task_postrun.connect(weak=False)
    def on_postrun(sender: Any = None, task_id: str = "", state: Any = None, **_: Any) -> None:
        if chaos_task(sender):
            record("outcome", task_id=task_id, state=str(state))

    @lock_skipped.connect(weak=False)
    def on_skipped(
        sender: Any, name: str, task_id: str, holder: Any, wait: float, **_: Any
    ) -> None:
        if chaos_task(sender):
            reason = "taken by another call" if holder not in (None, task_id) else "taken"
            record("skipped", task_id=task_id, name=name, holder=holder, wait=wait, reason=reason)

    @lock_lost.connect(weak=False)
    def on_lost(sender: Any, name: str, task_id: str, hold: Any, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            try:
                hold.check()  # no round trip: it raises what the hold was lost to
                reason = "ran out"
            except LockError as exc:
                reason = str(getattr(exc, "reason", type(exc).__name__))
            record("lost", name=name, task_id=task_id, token=hold.token, reason=reason)

    return app


app = make_app(
    os.environ.get("CSL_FAULT_LOCK_URL", "redis://127.0.0.1:1/0"),
    os.environ.get("CSL_FAULT_BROKER_URL", "redis://127.0.0.1:1/0"),
    os.environ.get("CSL_FAULT_PREFIX", "csltest:unset:"),
    os.environ.get("CSL_FAULT_QUEUE", "celery"),
)
