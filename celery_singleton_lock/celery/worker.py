"""The worker side of SingletonTask, from start to shutdown.

- ``SingletonRequest`` frees a run's lock from the worker's main process when the child that
  held it can no longer do so itself (hard time limit, revoke with terminate, child killed),
  instead of waiting for its lease to run out.
- ``SingletonLockStep`` (added by ``install(app)``; SingletonTask does so when bound: there is
  no entry point for bootsteps) checks the lock Redis at worker start and frees this
  process's locks at stop. Steps stop in the reverse order of their start, so the step puts
  itself just before the ``Pool`` step: it then stops only after the pool has stopped, that
  is after the running tasks have finished (warm shutdown) or been cut off (cold shutdown).
  Its place cannot be asked for with ``requires``: nothing the ``Pool`` step requires can
  require it, and the order of steps that do not depend on each other changes from one
  start to the next.
- Receivers of Celery's signals release what the process's runs still hold when it ends,
  and free the claim of a message revoked before it ran.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from typing import Any

from billiard.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery import bootsteps
from celery.bootsteps import RUN
from celery.signals import task_revoked, worker_process_shutdown, worker_shutdown
from celery.worker.components import Pool
from celery.worker.request import Request
from kombu.asynchronous import get_event_loop

from ..admin.doctor import ERROR, OK, check_eviction, read_server
from ..core.holder import HOSTNAME
from ..exceptions import ConfigurationError, LockError
from .app_client import lock_client_for
from .options import AppSettings
from .previous_life import free_previous_life

log = logging.getLogger("celery_singleton_lock.task")
#: The bootstep's own logger.
step_log = logging.getLogger("celery_singleton_lock.worker")


# -- the Request -------------------------------------------------------------------------------


#: Reported once the child has exited.
_CHILD_GONE = (Terminated, WorkerLostError)
#: Without an event loop: seconds after a hard time limit by which the pool has killed the
#: child (it sends SIGTERM, then SIGKILL 0.1 s later).
_KILL_GRACE = 1.0


class SingletonRequest(Request):  # type: ignore[misc]
    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)
        if not soft:
            self._release_after_kill()

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        try:
            super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        finally:
            exc = getattr(exc_info, "exception", None)
            exc = getattr(exc, "exc", exc)  # ExceptionWithTraceback
            if isinstance(exc, _CHILD_GONE):
                self._release_for_child(again=self._runs_again(exc))
            elif isinstance(exc, TimeLimitExceeded):
                self._release_after_kill()

    def _runs_again(self, exc: BaseException | None) -> bool:
        """Whether Celery sends the message of a run that ended with ``exc`` (a lost child, a
        hard time limit) to run again: requeued (``acks_late`` with ``reject_on_worker_lost``,
        or not acknowledged on a timeout) or retried (``retry_on_worker_lost``)."""
        task = self.task
        lost = isinstance(exc, WorkerLostError)
        if lost and getattr(task, "retry_on_worker_lost", False):
            return True
        if not task.acks_late:
            return False
        if lost:
            return bool(task.reject_on_worker_lost)
        if exc is None or isinstance(exc, TimeLimitExceeded):
            # Newer Celery splits acks_on_failure_or_timeout; an unset part falls back to it,
            # and an unset whole acknowledges.
            ack = getattr(task, "acks_on_timeout", None)
            if ack is None:
                ack = getattr(task, "acks_on_failure_or_timeout", None)
            return ack is not None and not ack
        return False

    def _release_after_kill(self) -> None:
        """Past the hard time limit the pool reports the run (on_failure, on_timeout) while its
        child still runs, and only then kills it: freeing the lock now would let another run
        of the key start beside the dying one. Free it once the pool has killed the child."""
        release = functools.partial(self._release_for_child, again=self._runs_again(None))
        hub = get_event_loop()
        if hub is not None:
            # After the timer callback that kills the child (billiard: on_hard_timeout).
            hub.call_later(0, release)  # type: ignore[no-untyped-call]
        else:
            timer = threading.Timer(_KILL_GRACE, release)
            timer.daemon = True
            timer.start()

    def _release_for_child(self, *, again: bool) -> None:
        """Free the lock the child ran under. A run cut off before its end leaves no
        release delay when its message runs ``again``: the release delay is for a job that ended,
        and would stand in the way of that very message."""
        task = self.task
        if not self.worker_pid:
            return  # no child is known to have run it: there is no holder to match
        try:
            name = task.lock_name(self.args, self.kwargs)
            # The child ran on this machine: its holder record carries this host name.
            released = task.release_holder(
                self.args,
                self.kwargs,
                task_id=self.id,
                pid=self.worker_pid,
                host=HOSTNAME,
                delay=0.0 if again else None,
            )
        except LockError as exc:
            log.warning("could not free the lock of %s[%s]: %s", task.name, self.id, exc)
            return
        if released:
            log.info("freed lock %r of %s[%s] whose process ended", name, task.name, self.id)


# -- the bootstep ------------------------------------------------------------------------------


class SingletonLockStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker bootstep of celery_singleton_lock."""

    label = "singleton-lock"

    def include(self, worker: Any) -> bool:
        """Take part in the worker's start and stop, placed before the ``Pool`` step."""
        included, obj = self._should_include(worker)
        if included:
            self.obj = obj
            steps = worker.steps
            pool = next((i for i, step in enumerate(steps) if isinstance(step, Pool)), None)
            steps.insert(len(steps) if pool is None else pool, self)
        return bool(included)

    def start(self, worker: Any) -> None:
        """Stop the worker (status 1) on settings or task options that can never work, with
        one CRITICAL line naming the bad one; only warn when Redis is merely down right now."""
        try:
            self._start(worker)
        except ConfigurationError as exc:
            # Celery logs an error out of a step with its traceback, which says nothing
            # about a bad setting the message does not; one line, and SystemExit, which
            # Celery's start turns into a stop with its status and no traceback.
            step_log.critical("Unrecoverable error: %r", exc)
            raise SystemExit(1) from None

    def _start(self, worker: Any) -> None:
        """Check the configuration (raising :class:`ConfigurationError`), then greet Redis."""
        app = worker.app
        AppSettings.for_app(app)  # refuses bad or unknown singleton_lock_* settings first
        named_tasks_error = getattr(app, "_singleton_lock_named_tasks_error", None)
        if named_tasks_error is not None:
            raise named_tasks_error  # singleton_lock_tasks, read at worker_init
        for task in list(app.tasks.values()):
            # SingletonTask's check, found by name: the task module imports this one.
            check = getattr(task, "check_lock_configuration", None)
            if callable(check):
                check()
        try:
            client = lock_client_for(app)
            client.ping()
        except ConfigurationError:
            raise  # a database the server does not have: the error names the URL's setting
        except LockError as exc:
            step_log.warning("singleton locks: Redis not reachable at start: %s", exc)
            return
        step_log.info("singleton locks on %s (prefix %r)", client.url, client.prefix)
        # An evicting Redis breaks every lock silently: say so once, where operators look.
        warn_if_evicting(client)
        try:
            free_previous_life(client, worker.hostname)
        except LockError as exc:
            step_log.warning("singleton locks: could not look for a previous life's: %s", exc)

    def stop(self, worker: Any) -> None:
        """Warm shutdown: the pool has drained, so no task of this process runs any more;
        release whatever is still held (each run released its own lock already)."""
        release_all_held()

    shutdown = stop

    def terminate(self, worker: Any) -> None:
        """Cold shutdown: release nothing. A run the pool cut off (a child terminated, a
        greenlet killed, the solo pool's body interrupted) released its own lock on its way
        out; a thread cannot be cut off, so its run goes on to its end holding its lock, and
        releasing that here would let another run in beside it. A lock whose holder dies
        without a word runs out within its lease."""


def warn_if_evicting(client: Any) -> None:
    """At worker start: one WARNING when the lock Redis may evict lock keys (one INFO and
    CONFIG GET; a CONFIG refused or disabled is logged as unknown, never an error)."""
    try:
        finding = check_eviction(read_server(client.redis, client.url))
    except Exception as exc:  # a worker starts whatever this read meets
        step_log.warning("singleton locks: could not read the eviction policy: %s", exc)
        return
    if finding.level == ERROR:
        step_log.warning(
            "singleton locks: %s: %s; fix: %s", finding.found, finding.breaks, finding.fix
        )
    elif finding.level != OK:
        step_log.warning("singleton locks: eviction policy unknown: %s", finding.found)


def install(app: Any) -> None:
    """Add the worker step to ``app`` (idempotent)."""
    app.steps["worker"].add(SingletonLockStep)


# -- shutdown and revoke receivers ---------------------------------------------------------------


#: The lock of every run of this process (SingletonTask adds each one it took). Shutdown
#: releases only these: a lock that user code took itself, in a task body to outlive the run
#: or in a thread of its own, is its code's to release; releasing it at shutdown could let a
#: second holder in while that code still runs.
_run_locks: weakref.WeakSet[Any] = weakref.WeakSet()


def track_run_lock(handle: Any) -> None:
    """Note ``handle`` as the lock of a run, for :func:`release_all_held`."""
    _run_locks.add(handle)


def release_all_held(**_: Any) -> None:
    """Release every run's lock this process still holds: at worker (process) shutdown, so a
    stopping worker frees its keys at once rather than after the lease runs out. Each run
    releases its own lock as it ends; what is left is a release that failed (Redis was
    unreachable), tried once more here."""
    for lock in list(_run_locks):
        if not lock.held:
            continue
        try:
            lock.release()
        except LockError as exc:
            log.warning("could not release %r at shutdown: %s", lock.name, exc)


def _release_at_worker_shutdown(sender: Any = None, **_: Any) -> None:
    """``worker_shutdown``: release what this process still holds, unless the worker's steps
    (its pool among them) are still running. Celery sends the signal after stopping them,
    except from ``stop(in_sighandler=True)`` on a pool that is not signal-safe (threads,
    gevent, eventlet), where the pool's tasks run on and still need their locks."""
    blueprint = getattr(sender, "blueprint", None)
    if getattr(blueprint, "state", None) == RUN:
        log.debug("worker_shutdown while the pool still runs: nothing released")
        return
    release_all_held()


def free_revoked_claim(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A message revoked (or expired) before it ran never takes its claim over: free the
    claim now rather than after its countdown plus ``lock_ttl``, so new calls are not
    deduplicated to a task that will never run. A run already under way holds its own lock,
    not the claim, so a revoke with ``terminate=True`` frees nothing here."""
    free_claim = getattr(sender, "free_claim", None)
    if free_claim is None or request is None or not getattr(request, "id", None):
        return
    try:
        freed = free_claim(
            request.args or (),
            request.kwargs or {},
            task_id=request.id,
            attempt=int(request.retries or 0),
        )
    except LockError as exc:
        log.warning("could not free the claim of revoked %s[%s]: %s", sender.name, request.id, exc)
        return
    if freed:
        log.info("freed the claim of revoked %s[%s]", sender.name, request.id)


task_revoked.connect(free_revoked_claim, weak=False)
worker_process_shutdown.connect(release_all_held, weak=False)
worker_shutdown.connect(_release_at_worker_shutdown, weak=False)
