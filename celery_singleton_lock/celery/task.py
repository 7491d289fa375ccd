"""SingletonTask: a Celery task base class that takes a Redis lease before its body runs.

    @app.task(base=SingletonTask, lock_ttl=3600)
    def nightly_report(day): ...

The lock is taken in the worker right before the body runs (so ``send_task``, beat,
redelivered messages and retries all go through it), renewed by the heartbeat every
``lock_lease / TICKS_PER_TTL`` seconds, and released when the body ends however it ends.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from functools import cached_property
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Ignore, Reject, Retry
from celery.worker import state as worker_state

from ..client import LockClient
from ..core.handle import LockHandle
from ..exceptions import ConfigurationError, LockBackendError, LockError, LockLost, LockTimeout
from ..kinds import registry
from ..kinds.lease import Lease, ReleaseResult
from ..kinds.registry import HandleFactory, Target
from . import claims, done_marks, enqueue, holders, own_holds, waiting_marks

# Connects the receivers that turn our signals into Celery task events (and must be in place
# before a worker starts, which always imports its tasks first).
from . import events as _events  # noqa: F401
from .app_client import lock_client_for
from .options import (
    DEBOUNCE,
    LOCK_MODES,
    OPTIONS,
    UNTIL_START,
    AppSettings,
    TaskLockOptions,
    check_lease_within_ttl,
    check_task_options,
)
from .results import skipped_result
from .signals import lock_acquired, lock_lost, lock_released, lock_skipped
from .task_keys import TaskKey

# Importing the task connects the worker's receivers of Celery's signals (release at shutdown,
# free revoked claims).
from .worker import install, track_run_lock

log = logging.getLogger("celery_singleton_lock.task")

#: A retry message kept back: its args, kwargs, task id, ``apply_async`` options and the
#: ``time.monotonic()`` of the ``retry()`` call.
_RetrySend = tuple[Any, Any, Any, dict[str, Any], float]


class _DeferredRetries(threading.local):
    """Per thread (greenlet, under gevent and eventlet): while ``retry(throw=False)`` runs,
    ``capture`` collects the retry message Celery would send at once; ``pending`` holds
    (run lock, message) pairs that the run sends when its body ends. Set per thread in
    ``__init__``: a missing attribute would cost every run a caught AttributeError."""

    def __init__(self) -> None:
        self.capture: list[_RetrySend] | None = None
        self.pending: list[tuple[LockHandle, _RetrySend]] = []


_deferred_retries = _DeferredRetries()


class _RunLocks(threading.local):
    """Per task and thread (greenlet): the locks of the runs under way, innermost last (a
    task may call itself from its body)."""

    def __init__(self) -> None:
        self.leases: list[LockHandle | None] = []


def worker_node(request: Any) -> str | None:
    """The node name (``celery@host``) of the worker running ``request``, None if unknown.

    Celery's threads and solo pools put the machine's host name in ``request.hostname``
    (only the prefork children get the node name there); the worker's own request object,
    among the active ones of this process, has the node name. It is looked up by task id
    (``worker.state.requests``) before the active ones are searched: this is on every run's
    path under those pools."""
    hostname = request.hostname
    if hostname and "@" in hostname:
        return str(hostname)
    task_id = request.id
    active = worker_state.requests.get(task_id)
    if active is not None and active in worker_state.active_requests:
        return str(active.hostname)
    # Reserved and not yet active (a copy of this message), or gone with the other delivery
    # of the same task id that ended first.
    for active in tuple(worker_state.active_requests):
        if active.id == task_id:
            return str(active.hostname)
    return None


class SingletonTask(Task):  # type: ignore[misc]
    """A task that never runs twice at once for the same key. Options (task attributes or
    ``@app.task`` keywords; None means: the app setting, else the default):"""

    # The options, typed for the type checker; each is None here (unset) and documented in
    # its declaration, options.OPTIONS, from which the class gets its values below.
    lock_ttl: float | None
    lock_lease: float | None
    lock_key: Any
    lock_wait: float | None
    lock_conflict: str | None
    lock_retry_countdown: float | None
    lock_release_delay: float | None
    lock_on_enqueue: bool | str | None
    lock_queue_ttl: float | None
    lock_mode: str | None
    lock_range: tuple[str, str] | None
    lock_keys: Any
    lock_limit: int | None
    lock_backend_down: str | None

    Request = "celery_singleton_lock.celery.worker:SingletonRequest"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name") or cls.__name__
        check_task_options(name, dict(cls.__dict__))
        # An explicit lease and ttl may come from different classes of the hierarchy.
        if cls.lock_ttl is not None and cls.lock_lease is not None:
            check_lease_within_ttl(
                f"{name}.lock_lease", float(cls.lock_lease), f"{name}.lock_ttl", cls.lock_ttl
            )

    @classmethod
    def on_bound(cls, app: Any) -> None:
        super().on_bound(app)
        install(app)

    # -- resolved configuration --------------------------------------------------------------

    def check_lock_configuration(self) -> None:
        """Raise :class:`ConfigurationError` if the app's lock settings or this task's
        options can never work; checked once per app and task, no Redis call."""
        AppSettings.for_app(self.app)
        self.lock_naming  # noqa: B018 (resolving the options and key templates is the check)

    def apply(self, args: Any = None, kwargs: Any = None, *rest: Any, **options: Any) -> Any:
        """As :meth:`celery.Task.apply`, but a configuration that can never work raises
        here rather than in the returned result."""
        self.check_lock_configuration()
        return super().apply(args, kwargs, *rest, **options)

    @cached_property
    def lock_options(self) -> TaskLockOptions:
        """This task's options, resolved against the app's settings."""
        return TaskLockOptions.resolve(self.name, self, self.app.conf)

    @cached_property
    def lock_naming(self) -> TaskKey:
        """Makes this task's lock names from its call arguments, checked against its
        signature."""
        options = self.lock_options
        naming = TaskKey(self.name, self.run, options.key)
        if options.range is not None:
            naming.check_arguments("lock_range", options.range)
        if isinstance(options.keys, tuple):
            naming.check_templates("lock_keys", options.keys)
        return naming

    @property
    def lock_client(self) -> LockClient:
        return lock_client_for(self.app)

    def lock_name(self, args: Any = (), kwargs: Any = None) -> str:
        """The lock name a call with these arguments takes (for a range lock: the resource;
        for a multi-key lock: its names joined with " + ")."""
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        options = self.lock_options
        if options.keys is not None:
            return " + ".join(sorted(self.lock_naming.names(options.keys, args, kwargs)))
        return self.lock_naming.name(args, kwargs, exclude=options.range or ())

    def make_lock(
        self,
        args: Any = (),
        kwargs: Any = None,
        *,
        mode: str | None = None,
        owner_info: dict[str, Any] | None = None,
        on_lost: Any = None,
        call: str | None = None,
    ) -> LockHandle:
        """The lock handle (not yet acquired) a call with these arguments takes: a lease,
        a read/upgradable/write hold, a range hold, a multi-key lease or a semaphore's
        permit, as the options say.
        ``mode`` overrides ``lock_mode`` (the ``task_locks`` fixture holds "write").
        ``call``: the call identity of a shared kind's hold (``own_holds.call_identity``),
        refused while a hold of the same call stands; leases and multi-key locks ignore it."""
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        options = self.lock_options
        mode = mode or options.mode
        make = self._handle_factory(self.lock_client, options, mode)
        naming = self.lock_naming
        # What the call locks, in the parts the options define: names, else a name (and the
        # bounds of a range). As lock_name() makes them, without converting the arguments
        # again: this is on every run's path.
        if options.keys is not None:
            names = tuple(naming.names(options.keys, args, kwargs))
            target = Target(" + ".join(sorted(names)), names)
        elif options.range is None:
            target = Target(naming.name(args, kwargs))
        else:
            name = naming.name(args, kwargs, exclude=options.range)
            target = Target(name, bounds=naming.bounds(options.range, args, kwargs))
        return make(target, mode, owner_info, on_lost, call)

    def _handle_factory(
        self, client: LockClient, options: TaskLockOptions, mode: str
    ) -> HandleFactory:
        """The handle factory of the task's lock family in ``mode``, with its ttl and
        max-hold checked once, not on every run (kept while the app's lock client and the
        resolved options stay the same objects)."""
        cached = self.__dict__.get("_lock_handle_factories")
        if cached is None or cached[0] is not client or cached[1] is not options:
            cached = (client, options, {})
            self.__dict__["_lock_handle_factories"] = cached
        factories: dict[str, HandleFactory] = cached[2]
        make = factories.get(mode)
        if make is None:
            if mode not in LOCK_MODES:
                raise ConfigurationError("mode", f"must be one of {list(LOCK_MODES)}, got {mode!r}")
            family = registry.family_named(options.kind(mode))
            if mode not in family.modes:
                raise ConfigurationError(
                    "mode", f"a {family.family} lock's modes are {list(family.modes)}, not {mode!r}"
                )
            if options.limit is not None:
                # A semaphore's permits need the task's limit, which a family cannot give.
                make = registry.permit_handles(
                    client.connection, options.lease, options.ttl, options.limit
                )
            else:
                make = family.handles(client.connection, options.lease, options.ttl)
            factories[mode] = make
        return make

    def release_holder(
        self,
        args: Any = (),
        kwargs: Any = None,
        *,
        task_id: str,
        pid: int,
        host: str | None = None,
        delay: float | None = None,
    ) -> bool:
        """Release the lock a call with these arguments takes (see :meth:`make_lock`), after
        a release delay of ``delay`` seconds (None: ``lock_release_delay``), if run ``task_id`` in
        process ``pid`` on ``host`` (default: this machine) holds it: for the worker's main
        process once that child is gone. Holders are matched by task id, pid and host, so no
        owner token is needed; a claim handed over to the task's next attempt is left alone.
        True if something was released."""
        handle = self.make_lock(args, kwargs)
        if delay is None:
            delay = self.lock_options.release_delay
        return handle.release_holder(task_id=task_id, pid=pid, host=host, delay=delay)

    @property
    def lock(self) -> LockHandle | None:
        """The lease the current run holds (None outside a run, or when running unlocked):
        use ``self.lock.token`` to fence writes and ``self.lock.check()`` to stop early."""
        runs: _RunLocks | None = self.__dict__.get("_lock_stack")
        return runs.leases[-1] if runs is not None and runs.leases else None

    # -- the run -----------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            return super().__call__(*args, **kwargs)  # a plain function call: no lock
        options = self.lock_options
        task_id = request.id
        attempt = request.retries or 0
        owner_info = {"task_name": self.name, "task_id": task_id, "attempt": str(attempt)}
        node = worker_node(request)
        if node is not None:
            # Only that node's answer can say the task is not active (evidence.py).
            owner_info["worker"] = node
        lease = self.make_lock(
            args,
            kwargs,
            owner_info=owner_info,
            on_lost=lambda lost: lock_lost.send(
                sender=self, name=lost.name, task_id=task_id, lease=lost
            ),
            # Shared holds are refused to a copy of this call in their acquire's own round
            # trip (held_by_call): read holds and permits would let it in beside its original.
            call=own_holds.call_identity(request),
        )
        name = lease.name
        self._drop_finished_copy(request)
        if isinstance(lease, Lease):
            claims.take_over_at_run(lease, task_id, attempt)
        if (
            options.on_enqueue in (UNTIL_START, DEBOUNCE)
            and not self._leave_queue_at_acquire(lease)
            and not self._leave_queue(args, kwargs)
        ):
            return self._replaced(lease, args, kwargs)
        started = time.monotonic()
        replaced = False
        found: list[holders.Holder] | None = None
        try:
            acquired = self._acquire(lease, 0.0)  # a float: check_wait's quick case
            if not acquired and self._replaced_at_acquire(lease):
                replaced = True  # the lock was not tried
            elif not acquired:
                # Before waiting: a copy of this very message must not wait for its original
                # to finish and then run a second time, nor skip a hold it may take over.
                found = holders.holders_of(lease)
                acquired = self._meet_own_hold(lease, found, node)
                if not acquired and options.wait:
                    acquired, found = self._wait_unless_copy(lease, options.wait, node), None
        except LockBackendError as exc:
            if options.backend_down != "run":
                self._autoretry(exc)
                raise LockBackendError(
                    f"{exc}; {self.name} did not run. To retry it when the lock Redis is "
                    "back: autoretry_for=(LockBackendError,); to run it unlocked instead: "
                    'lock_backend_down="run"',
                    name=exc.name,
                ) from exc
            log.warning("running %s[%s] UNLOCKED: %s", self.name, task_id, exc)
            return self._run_holding(None, args, kwargs)
        waited = time.monotonic() - started
        if replaced:
            return self._replaced(lease, args, kwargs)
        if not acquired:
            return self._conflict(lease, options, waited, found)
        track_run_lock(lease)
        lock_acquired.send(sender=self, name=name, task_id=task_id, lease=lease, wait=waited)
        return self._run_holding(lease, args, kwargs)

    def _leave_queue_at_acquire(self, lease: LockHandle) -> bool:
        """``until_start``/``debounce``: True if the queue claim is freed by the run lock's
        first acquire (same round trip); else :meth:`_leave_queue` frees it first. A retry
        frees it too: attempt 0 may have failed before it could (the lock Redis did not
        answer as it started)."""
        return isinstance(lease, Lease) and claims.free_at_acquire(
            lease, self.request.id, stop_if_replaced=self._replaceable()
        )

    def _replaceable(self) -> bool:
        """Whether a later call may replace this one in the queue: ``debounce``, and not a
        retry (which continues a call that started)."""
        return self.lock_options.on_enqueue == DEBOUNCE and not self.request.retries

    def _replaced_at_acquire(self, lease: LockHandle) -> bool:
        """``debounce``: True if a later call took this one's queue claim over, so the first
        acquire stopped there. ``until_start`` never replaces a call it let into the queue: a
        claim another call holds by then (this one's ran out or was freed) changes nothing,
        and the run honours ``lock_wait`` and ``lock_conflict`` as any other; nor is a retry,
        which continues a call that started."""
        return (
            isinstance(lease, Lease) and self._replaceable() and claims.replaced_at_acquire(lease)
        )

    def _leave_queue(self, args: Any, kwargs: Any) -> bool:
        """``until_start``/``debounce``: this call is no longer queued, so another may queue
        meanwhile. False if a later call replaced it in the queue (``debounce``, never for a
        retry)."""
        request = self.request
        try:
            code = claims.free_claim(self, args, kwargs, task_id=request.id, attempt=0)
        except LockError as exc:  # the claim runs out by itself
            log.warning("%s[%s] could not free its queue claim: %s", self.name, request.id, exc)
            return True
        return not (code == ReleaseResult.HELD_BY_ANOTHER and self._replaceable())

    def _replaced(self, lease: LockHandle, args: Any, kwargs: Any) -> Any:
        name = lease.name
        self._ignore_copy_of_self(lease, holders.holders_of(lease))  # it left the queue already
        try:
            latest = claims.replaced_by(self, args, kwargs)
        except LockError:
            latest = None
        why = f"replaced by queued task {latest}"
        return self._skip(name, latest, why, 0.0, logged=why)

    def _ignore_copy_of_self(self, lease: LockHandle, found: list[holders.Holder]) -> None:
        """Raise Ignore if the lock is held under this run's own task id: another delivery of
        this very message (visibility timeout, acks_late) met the original run, its retry or
        its release delay. The original's result is the one, so this copy stores nothing."""
        request = self.request
        if any(holder.task_id == request.id and not holder.waiting for holder in found):
            log.info(
                "%s[%s] ignored: a copy of the same task id holds %r",
                self.name,
                request.id,
                lease.name,
            )
            raise Ignore()

    def _meet_own_hold(
        self, lease: LockHandle, found: list[holders.Holder], node: str | None
    ) -> bool:
        """When the lease is held under this run's own task id (see own_holds.py), or a
        shared hold was refused as held by this very call (``held_by_call``): take a dead
        or earlier attempt's hold over (True: the lease is now held), or raise Ignore, for a
        later attempt's hold, or once this copy of a live original is re-queued. False when
        the lease is not held under this task id."""
        request = self.request
        if not lease.held_by_call and not any(holder.task_id == request.id for holder in found):
            return False
        # The release delay of this very call (it ran): nothing more to do, unless this copy
        # is to run the call again (its outcome was never stored), once the delay is over.
        delays = [holder for holder in found if holder.release_delay_until_ms is not None]
        own_delays = [
            until
            for holder in delays
            if holder.task_id == request.id and (until := holder.release_delay_until_ms)
        ]
        if own_delays and self._runs_again():
            self._requeue_or_ignore(own_holds.delay_verdict(self, max(own_delays)))
        verdict: own_holds.Verdict | None
        if isinstance(lease, Lease):
            hold, verdict = own_holds.assess(self, lease, node)
            if hold is not None and verdict is not None and verdict.action == own_holds.TAKE_OVER:
                lease.take_over = hold.owner
                if self._acquire(lease, 0.0):
                    log.warning("%s[%s] %s on %r", self.name, request.id, verdict.why, lease.name)
                    return True
                verdict = None
        else:
            # No take-over for the other kinds: the copy looks again once a dead holder's
            # lease could have run out, until the hold is gone or its task finished.
            self._ignore_copy_of_self(lease, delays)
            verdict = own_holds.requeue_verdict(self)
        if verdict is None:
            self._ignore_copy_of_self(lease, delays)
            # Changed hands meanwhile (let go, or another copy took it over): look again soon.
            verdict = own_holds.Verdict(
                own_holds.REQUEUE, "re-queued: its hold changed hands", own_holds.MARGIN_S
            )
        self._requeue_or_ignore(verdict)

    def _requeue_or_ignore(self, verdict: own_holds.Verdict) -> NoReturn:
        """Act on ``verdict`` for this copy of a message: re-queue it (REQUEUE) or not,
        and ignore this delivery (raise Ignore)."""
        request = self.request
        if verdict.action == own_holds.REQUEUE:
            own_holds.requeue(self, verdict.countdown, verdict.counted_in)
            log.info(
                "%s[%s] %s; looks again in %.1f s",
                self.name,
                request.id,
                verdict.why,
                verdict.countdown,
            )
        else:
            log.info("%s[%s] ignored: %s", self.name, request.id, verdict.why)
        raise Ignore()

    def _wait_unless_copy(self, lease: LockHandle, wait: float, node: str | None) -> bool:
        """Wait up to ``wait`` seconds for the lock, under a mark saying this delivery of
        the message waits (waiting_marks.py), removed when the wait ends. A copy of a
        delivery that waits already does not wait behind it (it would run the body a second
        time once its original ran): it is re-queued, as a copy of a live original is, and
        this delivery ignored."""
        request = self.request
        connection = self.lock_client.connection
        try:
            mark = waiting_marks.claim(
                connection,
                waiting_marks.mark_key(connection, lease, request.id, request.retries or 0),
                wait=wait,
                node=node,
                requeues=own_holds.requeues(request),
                max_countdown=own_holds.max_countdown(self.app),
            )
        except waiting_marks.CopyOfWaiting as copy:
            verdict = copy.verdict()
        else:
            try:
                acquired = self._acquire(lease, wait)
            finally:
                waiting_marks.remove(connection, mark)
            if acquired or not lease.held_by_call:
                return acquired
            # A hold of this very call stood by the time an attempt got in: as before waiting.
            return self._meet_own_hold(lease, holders.holders_of(lease), node)
        self._requeue_or_ignore(verdict)

    def _drop_finished_copy(self, request: Any) -> None:
        """A copy re-queued (behind a live original, own_holds.py, or for a missing outcome)
        is dropped, storing nothing, once the result backend shows that original finished:
        its result stands."""
        if not own_holds.requeued(request):
            return
        state = own_holds.finished(self, request.id)
        if state is not None:
            log.info("%s[%s] dropped: the original run ended (%s)", self.name, request.id, state)
            raise Ignore()

    def _done_mark(self, lease: LockHandle) -> done_marks.DoneMark | None:
        """The done mark (done_marks.py) of the running attempt, in ``lease``'s slot; None
        when ``singleton_lock_done_mark_ttl`` is 0 (no marks)."""
        ttl = self._done_mark_ttl
        if not ttl:
            return None
        request, connection = self.request, self.lock_client.connection
        return done_marks.DoneMark.of(connection, lease, request.id, request.retries or 0, ttl)

    @cached_property
    def _done_mark_ttl(self) -> float:
        """Seconds this task's done marks last (0: none), from the app's settings."""
        return done_marks.mark_ttl(self.app)

    def _acquire(self, lease: LockHandle, wait: float) -> bool:
        """``lease.acquire(wait)``, reading the done mark in each attempt's round trip: a
        copy of an attempt that ended already (done_marks.py) gives back what it took and is
        dropped (raise Ignore), storing nothing, whether or not it got the lock.

        Unless the call's outcome may be missing: the run that ended releases (and marks)
        before Celery stores its outcome, so a worker killed in between leaves a mark and no
        outcome. A copy that finds no outcome stored is re-queued once (its original, if
        alive, stores it meanwhile), and runs if there is still none when it comes back. Only
        that re-queue counts: a copy re-queued behind its live original before is re-queued
        once more."""
        mark = self._done_mark(lease)
        if mark is None:
            return lease.acquire(wait)
        acquired, ended = done_marks.acquire(self.lock_client.connection, lease, wait, mark)
        if ended < mark.attempt:
            return acquired
        request = self.request
        missing = self._outcome_missing()
        if missing and own_holds.requeues(request, own_holds.OUTCOME_REQUEUES_HEADER):
            log.warning(
                "%s[%s] runs again: attempt %d of this task id ended, but no outcome of it "
                "was stored (its worker stopped in between)",
                self.name, request.id, ended,
            )  # fmt: skip
            return acquired
        if acquired:
            try:
                lease.release()
            except LockError as exc:  # it runs out within its lease
                log.warning("%s[%s] could not give back %r: %s", self.name, request.id,
                            lease.name, exc)  # fmt: skip
        if missing:
            # Its original, if alive, stores the outcome within its lease.
            countdown = own_holds.look_again_in(self, self.lock_options.lease)
            why = f"re-queued: attempt {ended} of this task id ended, its outcome not stored yet"
            self._requeue_or_ignore(
                own_holds.Verdict(
                    own_holds.REQUEUE, why, countdown, own_holds.OUTCOME_REQUEUES_HEADER
                )
            )
        log.info("%s[%s] dropped: attempt %d of this task id ended already", self.name,
                 request.id, ended)  # fmt: skip
        raise Ignore()

    def _runs_again(self) -> bool:
        """Whether this copy is to run its call again: it was re-queued once for an outcome
        that is still not stored (:meth:`_acquire`)."""
        request = self.request
        return (
            bool(own_holds.requeues(request, own_holds.OUTCOME_REQUEUES_HEADER))
            and self._outcome_missing()
        )

    def _outcome_missing(self) -> bool:
        """Whether this call's outcome should be stored and the result backend has none
        (nothing, or only STARTED), or does not answer."""
        request = self.request
        if self.ignore_result or getattr(request, "ignore_result", False):
            return False
        if not claims.has_result_backend(self):
            return False
        return claims.result_state(self, request.id) in (None, "PENDING", "STARTED")

    def _record_end(self, lease: LockHandle) -> None:
        """Write the running attempt's done mark alone: its call ended without a release to
        send it with (skipped, refused, retried)."""
        mark = self._done_mark(lease)
        if mark is not None:
            done_marks.record(self.lock_client.connection, mark)

    def _autoretry(self, exc: LockBackendError) -> None:
        """Retry as ``autoretry_for`` would: Celery's wrapper is around ``run``, which a run
        whose lock could not be taken never reaches."""
        autoretry = tuple(getattr(self, "autoretry_for", ()) or ())
        dont = tuple(getattr(self, "dont_autoretry_for", ()) or ())
        if not autoretry or not isinstance(exc, autoretry) or (dont and isinstance(exc, dont)):
            return
        retry_kwargs = dict(getattr(self, "retry_kwargs", None) or {})
        backoff = float(getattr(self, "retry_backoff", False))
        if backoff:
            from celery.utils.time import get_exponential_backoff_interval

            retry_kwargs["countdown"] = get_exponential_backoff_interval(
                factor=int(max(1.0, backoff)),
                retries=self.request.retries,
                maximum=int(getattr(self, "retry_backoff_max", 600)),
                full_jitter=getattr(self, "retry_jitter", True),
            )
        raise self.retry(exc=exc, **retry_kwargs)

    def _run_holding(self, lease: LockHandle | None, args: Any, kwargs: Any) -> Any:
        runs: _RunLocks | None = self.__dict__.get("_lock_stack")
        if runs is None:
            # Not setdefault(name, _RunLocks()) alone: that would make a new local per run.
            runs = self.__dict__.setdefault("_lock_stack", _RunLocks())
        runs.leases.append(lease)
        # Whether the body ended by itself (returned, raised an error): only then is the
        # attempt marked done. Cut short (SystemExit, a signal) or handing the message on
        # (Ignore, Reject: Task.replace keeps the task id), a redelivery runs it again.
        ended = False
        try:
            if self._called_by_tracer():
                outcome = self.run(*args, **kwargs)
            else:
                outcome = super().__call__(*args, **kwargs)
            ended = True
            return outcome
        except (Ignore, Reject):
            raise
        except Exception:
            ended = True
            raise
        finally:
            runs.leases.pop()
            sends = _take_deferred(lease)
            if sends:
                self._send_deferred_retries(lease, sends, ended=ended)
            elif lease is not None and (lease.held or lease.lost):
                self._release(lease, ended=ended)

    def _called_by_tracer(self) -> bool:
        """Whether this call is the run Celery's tracer (a worker, ``apply``) started, whose
        task and request it pushed already: Celery's ``Task.__call__`` would push a copy of
        that request. The test is Celery's own (``celery.app.trace``'s stack protection,
        which only a ``celery worker`` process installs): the tracer's request, alone on
        the stack and not yet claimed; claiming it sends a nested call of the task from
        its own body through ``Task.__call__``, which pushes that call's request."""
        requests = self.request_stack.stack  # one look-up of this thread's stack, not two
        if len(requests) != 1:
            return False
        request = requests[0]
        if request._protected or request.called_directly:
            return False
        request._protected = 1
        return True

    def _release(self, lease: LockHandle, *, ended: bool = True) -> None:
        """Release the run's lock; if its call ``ended``, with the attempt's done mark
        written first in the same round trip (done_marks.py)."""
        try:
            mark = self._done_mark(lease) if ended else None
            if mark is not None:
                connection = self.lock_client.connection
                done_marks.release(connection, lease, self.lock_options.release_delay, mark)
            else:
                lease.release(delay=self.lock_options.release_delay)
        except LockLost as exc:
            # Not released by this run: lock_lost was sent (on_lost) when it was found lost.
            if exc.reason == "max_hold":
                log.error(
                    "%s[%s] ran past lock_ttl (%g s), the cap on one run's hold: lock_ttl "
                    "reached, its lock ran out then; raise lock_ttl for runs this long",
                    self.name, self.request.id, self.lock_options.ttl,
                )  # fmt: skip
                return
            log.error("%s[%s] ran without its lock at the end: %s", self.name, self.request.id, exc)
            return
        except LockError as exc:
            log.warning(
                "%s[%s] could not release %r: %s", self.name, self.request.id, lease.name, exc
            )
            return
        lock_released.send(sender=self, name=lease.name, task_id=self.request.id, lease=lease)

    def _conflict(
        self,
        lease: LockHandle,
        options: TaskLockOptions,
        waited: float,
        found: list[holders.Holder] | None = None,
    ) -> Any:
        name = lease.name
        if found is None:
            found = holders.holders_of(lease)
        why = holders.describe(found)
        if options.conflict != "skip":
            exc = LockTimeout(f"{self.name}: lock {name!r} is taken ({why})", name=name)
            if options.conflict == "raise":
                self._record_end(lease)
                raise exc
            try:
                raise self.retry(countdown=options.retry_countdown, exc=exc)
            finally:
                # Once the retry is sent (or refused: the call failed): a copy of this
                # attempt must not run beside the retry.
                self._record_end(lease)
        holder = holders.holder_task_id(found)
        self._record_end(lease)
        return self._skip(name, holder, why, waited, logged=f"lock {name!r} {why}")

    def _skip(self, name: str, holder: str | None, why: str, waited: float, logged: str) -> Any:
        """Skip the body: log, send ``lock_skipped`` and return the skipped result."""
        task_id = self.request.id
        log.info("%s[%s] skipped: %s", self.name, task_id, logged)
        lock_skipped.send(
            sender=self, name=name, task_id=task_id, lease=None, wait=waited, holder=holder
        )
        return skipped_result(name, holder, why)

    # -- retry: hand the lock to the retry message -------------------------------------------

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: datetime.datetime | None = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Any:
        """As :meth:`celery.Task.retry`; the held lock passes to the retried run first, so
        no duplicate can start in between (and the retry is not skipped as a duplicate).

        With ``throw=False`` the body goes on after this call, still holding the lock: the
        retry message is sent when the body ends (however it ends), once the lock has passed
        to it, so the retried run never starts beside this one. A ``countdown`` still counts
        from this call."""
        lease = self.lock
        call = dict(args=args, kwargs=kwargs, exc=exc, throw=throw, eta=eta, countdown=countdown)
        call.update(max_retries=max_retries, **options)
        if lease is None or not lease.held:
            return super().retry(**call)
        if not throw:
            # Celery's retry (its checks, its ``Retry``), with the message it sends kept back
            # until the body ends (:meth:`_send_deferred_retries`).
            captured: list[_RetrySend] = []
            _deferred_retries.capture = captured
            try:
                outcome = super().retry(**call)
            finally:
                _deferred_retries.capture = None
            _deferred_retries.pending.extend((lease, send) for send in captured)
            return outcome
        request = self.request
        if countdown is None and eta is None:
            until_run = float(self.default_retry_delay or 0)
        else:
            until_run = enqueue.seconds_until(eta, countdown)
        next_owner, handed = self._hand_over(
            lease,
            request.args if args is None else args,
            request.kwargs if kwargs is None else kwargs,
            (request.retries or 0) + 1,
            until_run,
        )
        if next_owner is None:  # the retry itself must still be sent
            try:
                return super().retry(**call)
            except Exception:
                # Sent (Retry), or refused (the call failed): this attempt ended. Marked
                # only now, though its lock was let go before: a worker killed before the
                # retry was sent leaves the message to run again.
                self._record_end(lease)
                raise
        try:
            return super().retry(**call)
        except Retry:
            if handed:
                lock_released.send(sender=self, name=lease.name, task_id=request.id, lease=lease)
            # The retry is sent: this attempt ended (its claim kept copies out until now).
            self._record_end(lease)
            raise
        except BaseException as exc:
            # No retry was sent (max_retries reached, broker error): this run was the last,
            # so its claim goes as the run's own lock would, release delay included, after
            # the attempt's done mark (none if the run was cut short); also a claim whose
            # hand-over was not answered, which may be there all the same.
            if isinstance(exc, Exception):
                self._record_end(lease)
            claims.release_handed_over(
                self, lease.name, next_owner, self.lock_options.release_delay
            )
            raise

    def _send_deferred_retries(
        self, lease: LockHandle | None, sends: list[_RetrySend], *, ended: bool = True
    ) -> None:
        """The body ended: pass the run's lock to the retry kept back by
        ``retry(throw=False)`` (or release it: another key, another kind), then send it;
        then mark the attempt done if the body ``ended`` by itself."""
        request = self.request
        for args, kwargs, task_id, options, called_at in sends:
            options = dict(options)
            if options.get("countdown") is not None:
                # Counted from the retry() call, as Celery would have sent it then.
                options["countdown"] = max(
                    0.0, float(options["countdown"]) - (time.monotonic() - called_at)
                )
            next_owner, handed = None, False
            if lease is not None and lease.held:
                next_owner, handed = self._hand_over(
                    lease,
                    args,
                    kwargs,
                    int(options.get("retries") or (request.retries or 0) + 1),
                    enqueue.seconds_until(options.get("eta"), options.get("countdown")),
                )
            elif lease is not None and lease.lost:
                self._release(lease, ended=ended)  # reports it lost
            try:
                self.apply_async(args, kwargs, task_id=task_id, **options)
            except Exception as exc:
                # Celery would have rejected the run at the retry() call; the body has ended.
                log.error("%s[%s] could not send its retry: %s", self.name, request.id, exc)
                if next_owner is not None and lease is not None:
                    claims.release_handed_over(
                        self, lease.name, next_owner, self.lock_options.release_delay
                    )
                continue
            if handed and lease is not None:
                lock_released.send(sender=self, name=lease.name, task_id=request.id, lease=lease)
        if ended and lease is not None:
            self._record_end(lease)

    def _hand_over(
        self, lease: LockHandle, args: Any, kwargs: Any, attempt: int, until_run: float
    ) -> tuple[str | None, bool]:
        """Hand the run's held ``lease`` to attempt ``attempt``, the retry with these
        arguments that may run in ``until_run`` seconds. Returns its claim's owner token
        (None if the lock was released instead or lost already: the retried run then takes
        the lock for itself) and whether Redis answered that it was handed over."""
        request = self.request
        if not isinstance(lease, Lease) or lease.name != self.lock_name(args, kwargs):
            # Another key, or a kind with no claims (read/write, range, multi): let go now,
            # unmarked (the caller marks the attempt once its retry is sent).
            self._release(lease, ended=False)
            return None, False
        try:
            owner = claims.hand_over(
                self, lease, request.id, attempt, until_run + self.lock_options.ttl
            )
        except LockBackendError as exc:
            # No answer: the hand-over may have run (its reply lost), its claim then waiting
            # for a retry that may not be sent. Its owner token, so that the claim goes as
            # an answered one does if no retry is sent (owner-checked: if the hand-over
            # never ran, the run's lease runs out by itself).
            log.warning(
                "%s[%s] retries, its lock maybe not handed over: %s", self.name, request.id, exc
            )
            return claims.claim_owner(request.id, attempt), False
        except LockError as exc:
            # Lost already: the retried run takes the lock for itself.
            log.warning("%s[%s] retries without its lock: %s", self.name, request.id, exc)
            return None, False
        return owner, True

    # -- enqueue-time lock -------------------------------------------------------------------

    def apply_async(
        self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any
    ) -> Any:
        """As :meth:`celery.Task.apply_async`. With ``lock_on_enqueue`` a duplicate of a
        queued (or running) call is not sent: its ``AsyncResult`` comes back instead (or
        :class:`DuplicateTask` is raised with ``lock_conflict="raise"``). Retries and
        members of a canvas are always sent (see docs/tasks.md)."""
        capture = _deferred_retries.capture
        if capture is not None:  # retry(throw=False): sent when the body ends
            capture.append((args, kwargs, task_id, options, time.monotonic()))
            return self.AsyncResult(task_id)
        self.check_lock_configuration()  # no message that can never run is sent
        send = super().apply_async
        if (
            not self.lock_options.on_enqueue
            or self.app.conf.task_always_eager
            or enqueue.is_retry(self, task_id, options)
        ):
            return send(args, kwargs, task_id=task_id, **options)
        return enqueue.send_once(self, send, args, kwargs, task_id, options)

    def free_claim(self, args: Any, kwargs: Any, *, task_id: str, attempt: int) -> bool:
        """Free the claim that attempt ``attempt`` of task ``task_id`` (a call with these
        arguments) holds for its queued message, if it still holds it: the message will not
        run (revoked, expired). True if a claim was freed."""
        freed = claims.free_claim(self, args, kwargs, task_id=task_id, attempt=attempt)
        return freed == ReleaseResult.RELEASED


def _take_deferred(lease: LockHandle | None) -> list[_RetrySend]:
    """The retry messages ``retry(throw=False)`` kept back in the run holding ``lease``,
    taken off this thread's list."""
    pending = _deferred_retries.pending
    if not pending or lease is None:
        return []
    mine = [send for held, send in pending if held is lease]
    if mine:
        pending[:] = [(held, send) for held, send in pending if held is not lease]
    return mine


for _option in OPTIONS:
    setattr(SingletonTask, _option.name, None)
SingletonTask.__doc__ = (SingletonTask.__doc__ or "") + "".join(
    f"\n\n    ``{option.name}``: {option.doc}" for option in OPTIONS
)
del _option
