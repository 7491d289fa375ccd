"""Celery task events for what a run's lock did, so Flower, ``celery events`` and other event
consumers see skipped and lost runs next to Celery's own ``task-started``/``task-succeeded``.
The event types and their fields are listed in docs/monitoring.md.

The field names start with ``lock_`` because Flower merges an event's fields into its view of
the task: a field called ``name`` would replace the task's name there.

Events are sent only by a worker that sends task events (under the prefork pool a child
follows the setting as it was when the child started), only for tasks whose ``send_events``
is true, and never for eager runs. They go out from a sender thread of their own, so a slow or
unreachable broker does not hold up the run; one that fails to send is logged at WARNING.
Loaded with :mod:`.task`: no set-up.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import weakref
from typing import Any

from celery.signals import task_postrun, worker_init, worker_process_shutdown, worker_shutdown

from ..exceptions import LockError, LockLost
from .signals import lock_acquired, lock_lost, lock_released, lock_skipped

log = logging.getLogger("celery_singleton_lock.events")

ACQUIRED = "task-lock-acquired"
SKIPPED = "task-lock-skipped"
LOST = "task-lock-lost"
RELEASED = "task-lock-released"
#: Every event type this module sends.
EVENT_TYPES = (ACQUIRED, SKIPPED, LOST, RELEASED)
#: Seconds a stopping worker (process) waits for its unsent events to go out.
FLUSH_AT_SHUTDOWN = 5.0

# app -> the worker that runs its tasks in this process (or, in a prefork child, the worker
# it was forked from). Weak both ways: test suites make an app and a worker per test.
_workers: weakref.WeakKeyDictionary[Any, weakref.ref[Any]] = weakref.WeakKeyDictionary()
# task id -> hostname, for runs whose acquire was announced. lock_lost comes from the
# heartbeat thread, where the run's request (eager or not, which worker) is out of reach.
_announced: dict[str, str] = {}


def _remember_worker(sender: Any, **_: Any) -> None:
    _workers[sender.app] = weakref.ref(sender)


def worker_sends_task_events(worker: Any) -> bool:
    """True if ``worker`` sends task events now: its live event dispatcher says so where
    there is one (Flower's enable/disable events change it), else its ``-E`` setting."""
    consumer = getattr(worker, "consumer", None)
    dispatcher = getattr(consumer, "event_dispatcher", None)
    if dispatcher is None:
        return bool(worker.task_events)
    return bool(dispatcher.enabled) and (not dispatcher.groups or "task" in dispatcher.groups)


def _event_hostname(task: Any) -> str | None:
    """The hostname to send this run's events as, or None if it sends none."""
    # The worker first: without -E (the common case) the answer is known before the
    # request is looked up, and this runs on every acquire.
    ref = _workers.get(task.app)
    worker = ref() if ref is not None else None
    if worker is None or not worker_sends_task_events(worker):
        return None
    request = task.request
    if request.is_eager or not request.id or not getattr(task, "send_events", True):
        return None
    return str(request.hostname or worker.hostname)


def lock_fields(task: Any, name: str, holder: str | None, hold: Any) -> dict[str, Any]:
    """The ``lock_*`` fields every event of ``task``'s lock carries."""
    options = task.lock_options
    mode = "write" if options.range is not None and options.mode == "exclusive" else options.mode
    if options.keys is not None:
        kind = "multi"
    elif options.limit is not None:
        kind = "semaphore"  # a permit: `celery locks list` shows `semaphore/<limit>`
    elif options.range is not None:
        kind = "range"
    elif mode != "exclusive":
        kind = mode  # a reader-writer hold, named as `celery locks list` names it
    else:
        kind = "lease"
    return {
        "lock_name": name,
        "lock_kind": kind,
        "lock_mode": mode,
        "lock_holder": holder,
        "lock_token": getattr(hold, "token", None),
    }


def send_lock_event(app: Any, hostname: str, type_: str, task_id: str, **fields: Any) -> bool:
    """Send one event of ``type_`` about run ``task_id`` through ``app``'s broker, once, with
    no retry; True if sent. Never raises (a failure is logged)."""
    try:
        with app.events.default_dispatcher(hostname=hostname) as dispatcher:
            dispatcher.send(type_, uuid=task_id, retry=False, **fields)
    except Exception as exc:
        log.warning("could not send %s for %s: %r", type_, task_id, exc)
        return False
    return True


class EventSender:
    """This process's queue of events to send and the daemon thread sending them in order."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def submit(self, app: Any, hostname: str, type_: str, task_id: str, **fields: Any) -> None:
        """Queue one event (see :func:`send_lock_event`); returns at once."""
        self._ensure_thread()
        self._queue.put((app, hostname, type_, task_id, fields))

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the events queued so far to be sent (or given
        up on); True if they were."""
        if self._thread is None or not self._thread.is_alive():
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="celery-singleton-lock-events", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            app, hostname, type_, task_id, fields = item
            send_lock_event(app, hostname, type_, task_id, **fields)


_sender = EventSender()


def _after_fork() -> None:
    # The parent's sender thread does not exist in the child, nor do its queued events
    # belong there.
    global _sender
    _sender = EventSender()


os.register_at_fork(after_in_child=_after_fork)


def flush(timeout: float = FLUSH_AT_SHUTDOWN, **_: Any) -> bool:
    """Wait up to ``timeout`` seconds for this process's queued events to be sent."""
    return _sender.flush(timeout)


def _on_acquired(sender: Any, name: str, task_id: str, hold: Any, **kwargs: Any) -> None:
    hostname = _event_hostname(sender)
    if hostname is None:
        return
    _announced[task_id] = hostname
    fields = lock_fields(sender, name, task_id, hold)
    _sender.submit(sender.app, hostname, ACQUIRED, task_id, lock_wait=kwargs.get("wait"), **fields)


def _on_skipped(sender: Any, name: str, task_id: str, **kwargs: Any) -> None:
    hostname = _event_hostname(sender)
    if hostname is None:
        return
    fields = lock_fields(sender, name, kwargs.get("holder"), None)
    _sender.submit(sender.app, hostname, SKIPPED, task_id, lock_wait=kwargs.get("wait"), **fields)


def _on_lost(sender: Any, name: str, task_id: str, hold: Any, **_: Any) -> None:
    hostname = _announced.get(task_id)
    if hostname is None:
        return
    fields = lock_fields(sender, name, task_id, hold)
    _sender.submit(sender.app, hostname, LOST, task_id, lock_reason=_lost_reason(hold), **fields)


def _lost_reason(hold: Any) -> str:
    try:
        hold.check()
    except LockLost as exc:
        # A run's max_hold is its lock_ttl: named as the task option that sets it.
        return "lock_ttl" if exc.reason == "max_hold" else str(exc.reason)
    except LockError:
        pass
    return "lost"


def _on_released(sender: Any, name: str, task_id: str, hold: Any, **_: Any) -> None:
    hostname = _announced.pop(task_id, None)
    if hostname is None:
        return
    _sender.submit(
        sender.app, hostname, RELEASED, task_id, **lock_fields(sender, name, task_id, hold)
    )


def _forget_run(task_id: str | None = None, **_: Any) -> None:
    # A run whose release failed (Redis unreachable) sends no lock_released.
    if task_id is not None:
        _announced.pop(task_id, None)


def _sends_events(sender: Any, **_: Any) -> bool:
    """lock_acquired's test: its receiver acts only for a run that sends task events."""
    return _event_hostname(sender) is not None


def _was_announced(sender: Any, task_id: str = "", **_: Any) -> bool:
    """lock_released's and lock_lost's test: their receivers act only for a run whose
    acquire was announced."""
    return task_id in _announced


worker_init.connect(_remember_worker, weak=False)
task_postrun.connect(_forget_run, weak=False)
lock_acquired.connect_checked(_on_acquired, _sends_events)
lock_skipped.connect_checked(_on_skipped, _sends_events)
lock_lost.connect_checked(_on_lost, _was_announced)
lock_released.connect_checked(_on_released, _was_announced)
worker_process_shutdown.connect(flush, weak=False)
worker_shutdown.connect(flush, weak=False)
