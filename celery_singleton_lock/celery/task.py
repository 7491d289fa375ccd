"""SingletonTask: a Celery task base class that takes a Redis lock before its body runs.

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
from typing import Any, cast

from celery import Task
from celery.exceptions import Ignore, Reject, Retry
from celery.worker import state as worker_state

from ..client import LockClient
from ..core.handle import HolderRecord, LockHandle
from ..core.handle_state import OptionNames
from ..exceptions import ConfigurationError, LockBackendError, LockError, LockLost, LockTimeout
from ..kinds import registry
from ..kinds.lease import Lease, ReleaseResult
from ..kinds.registry import HandleMaker, Target
from . import claims, done_marks, enqueue, holders, own_holds, run_model, sends, waiting_marks

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

#: What a run's lock handle calls its ttl and max_hold (see :meth:`SingletonTask.make_lock`).
TASK_OPTION_NAMES = OptionNames(ttl="lock_lease", max_hold="lock_ttl")

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
    """Per task and thread (greenlet): the holds of the runs under way, innermost last (a
    task may call itself from its body)."""

    def __init__(self) -> None:
        self.holds: list[LockHandle | None] = []


class _Run:
    """One delivery's run as task.__call__ drives it: its hold (the handle of its lock, of
    whatever kind), worker node and arguments, and what its observations found that acting
    needs (the holders in its way, the owner token of its own hold to take over, the lock
    Redis's error)."""

    def __init__(
        self,
        hold: LockHandle,
        node: str | None,
        args: Any,
        kwargs: Any,
        mark: done_marks.DoneMark | None,
    ) -> None:
        self.hold, self.node, self.args, self.kwargs = hold, node, args, kwargs
        #: The done mark of the attempt (None: marks off), read with each acquire and
        #: written with the release.
        self.mark = mark
        self.found: list[HolderRecord] | None = None
        self.own_owner: str | None = None
        self.error: LockBackendError | None = None


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

    #: Whether the ``__call__`` after SingletonTask's in the class's method order is Celery's
    #: own ``Task.__call__`` (set per class, :func:`_plain_call_after`): only then may a run
    #: the worker's tracer started call ``run`` directly. Not annotated: the annotations are
    #: the options' (tests/tasks/test_task_config.py).
    _plain_call_after = True

    #: The error of an option declared by ``@app.task`` that can never work, raised by
    #: :meth:`check_lock_configuration` (see ``__init_subclass__``); None when the options
    #: are good. Not annotated, as above (the cast gives mypy its type).
    _lock_class_error = cast("ConfigurationError | None", None)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._plain_call_after = _plain_call_after(cls)
        name = cls.__dict__.get("name") or cls.__name__
        try:
            check_task_options(name, dict(cls.__dict__))
            # An explicit lease and ttl may come from different classes of the hierarchy.
            if cls.lock_ttl is not None and cls.lock_lease is not None:
                check_lease_within_ttl(
                    f"{name}.lock_lease", float(cls.lock_lease), f"{name}.lock_ttl", cls.lock_ttl
                )
        except ConfigurationError as exc:
            # A class statement raises where it stands. A class @app.task makes (Celery
            # marks it ``_decorated``) is made inside ``app.finalize()``, which a worker calls
            # before its steps: raised there, the error would escape as a traceback through
            # Celery's start-up. It is kept for check_lock_configuration instead, which the
            # worker step (one line, then exit), delay() and apply() call before anything.
            if not cls.__dict__.get("_decorated"):
                raise
            cls._lock_class_error = exc

    @classmethod
    def on_bound(cls, app: Any) -> None:
        super().on_bound(app)
        install(app)

    # -- resolved configuration --------------------------------------------------------------

    def check_lock_configuration(self) -> None:
        """Raise :class:`ConfigurationError` if the app's lock settings or this task's
        options can never work; checked once per app and task, no Redis call."""
        if self._lock_class_error is not None:
            raise self._lock_class_error.with_traceback(None)
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
        a read/upgradable/write hold, a range hold, a multi-key hold or a semaphore's
        permit, as the options say.
        ``mode`` overrides ``lock_mode`` (the ``task_locks`` fixture holds "write").
        ``call``: the call identity of a shared kind's hold (``sends.call_identity``),
        refused while a hold of the same call stands; leases and multi-key locks ignore it."""
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        options = self.lock_options
        mode = mode or options.mode
        make = self._handle_maker(self.lock_client, options, mode)
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
        handle = make(target, mode, owner_info, on_lost, call)
        # The handle's ttl is the run's lease and its max_hold the run's cap: its messages
        # (the heartbeat's, check()'s, the release's) name the options the task set.
        handle.option_names = TASK_OPTION_NAMES
        return handle

    def _handle_maker(self, client: LockClient, options: TaskLockOptions, mode: str) -> HandleMaker:
        """The handle maker of the task's lock family in ``mode``, with its ttl and
        max-hold checked once, not on every run (kept while the app's lock client and the
        resolved options stay the same objects)."""
        cached = self.__dict__.get("_lock_handle_makers")
        if cached is None or cached[0] is not client or cached[1] is not options:
            cached = (client, options, {})
            self.__dict__["_lock_handle_makers"] = cached
        makers: dict[str, HandleMaker] = cached[2]
        make = makers.get(mode)
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
                    client.connection,
                    ttl=options.lease,
                    max_hold=options.max_hold,
                    limit=options.limit,
                )
            else:
                make = family.handles(
                    client.connection, ttl=options.lease, max_hold=options.max_hold
                )
            makers[mode] = make
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
        """The lock handle the current run holds (None outside a run, or when running unlocked):
        use ``self.lock.token`` to fence writes and ``self.lock.check()`` to stop early."""
        runs: _RunLocks | None = self.__dict__.get("_lock_stack")
        return runs.holds[-1] if runs is not None and runs.holds else None

    # -- the run -----------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            return super().__call__(*args, **kwargs)  # a plain function call: no lock
        task_id = request.id
        attempt = request.retries or 0
        owner_info = {"task_name": self.name, "task_id": task_id, "attempt": str(attempt)}
        send = sends.send_of(request)
        if send:
            # Tells a copy of this message from another send of its task id (sends.py).
            owner_info["send"] = send
        node = worker_node(request)
        if node is not None:
            # Only that node's answer can say the task is not active (evidence.py).
            owner_info["worker"] = node
        hold = self.make_lock(
            args,
            kwargs,
            owner_info=owner_info,
            on_lost=lambda lost: lock_lost.send(
                sender=self, name=lost.name, task_id=task_id, hold=lost
            ),
            # Shared holds are refused to a copy of this call in their acquire's own round
            # trip (held_by_call): read holds and permits would let it in beside its original.
            call=sends.call_identity(request),
        )
        if isinstance(hold, Lease):
            claims.take_over_at_run(hold, task_id, attempt)
        run = _Run(hold, node, args, kwargs, self._done_mark(hold))
        snapshot = self._first_snapshot(hold)
        started = time.monotonic()
        while (action := run_model.decide(snapshot)).kind not in run_model.ENDS:
            try:
                self._observe(action, snapshot, run)
            except LockBackendError as exc:
                run.error = exc
                snapshot.backend_error = str(exc)
        return self._act(action, snapshot, run, time.monotonic() - started)

    # -- the run: observe, then act on what run_model.decide() answers ------------------------

    def _first_snapshot(self, hold: LockHandle) -> run_model.Snapshot:
        """What a delivery knows as it starts: its request and its options."""
        request, options = self.request, self.lock_options
        leaves_queue = options.on_enqueue in (UNTIL_START, DEBOUNCE)
        return run_model.Snapshot(
            attempt=request.retries or 0,
            wait=float(options.wait or 0.0),
            conflict=options.conflict,
            backend_down=options.backend_down,
            takes_over=isinstance(hold, Lease),
            requeued=sends.requeued(request),
            new_send=sends.unmarked_is_new(request, self._broker_marks_redeliveries),
            outcome_requeued=bool(sends.requeues(request, sends.OUTCOME_REQUEUES_HEADER)),
            leaves_queue_first=leaves_queue and not self._leave_queue_at_acquire(hold),
        )

    def _observe(self, action: run_model.Action, s: run_model.Snapshot, run: _Run) -> None:
        """Make the observation (or the step) ``action`` asks for, and record what it found
        in ``s`` (the snapshot grows; decide() only reads it)."""
        request, hold, kind = self.request, run.hold, action.kind
        if kind == run_model.READ_FINISHED:
            s.finished = own_holds.finished(self, request.id) or ""
            return
        if kind == run_model.LEAVE_QUEUE:
            s.left_queue = self._leave_queue(run.args, run.kwargs)
            return
        if kind == run_model.READ_OUTCOME:
            s.outcome_missing = self._outcome_missing()
            return
        if kind == run_model.ACQUIRE:
            # A float: check_wait's quick case.
            s.acquired, s.ended = self._acquire(hold, 0.0, run.mark)
            s.replaced_at_acquire = not s.acquired and self._replaced_at_acquire(hold)
            s.held_by_call = hold.held_by_call
            return
        if kind == run_model.READ_HOLDS:
            run.found = found = holders.holders_of(hold)
            own = [h for h in found if sends.same_call(h.task_id, h.send, request)]
            delays = [h.release_delay_until_ms for h in own if h.release_delay_until_ms]
            s.holds_read = True
            s.own_hold = any(not h.waiting for h in own)
            s.own_delay_until_ms = max(delays) if delays else None
            return
        if kind == run_model.READ_OWN_HOLD:
            assert isinstance(hold, Lease)
            own_hold, verdict = own_holds.assess(self, hold, run.node)
            run.own_owner = None if own_hold is None else own_hold.owner
            s.own_assessed, s.own_verdict = True, verdict
            return
        if kind == run_model.TAKE_OVER:
            assert isinstance(hold, Lease) and run.own_owner is not None
            hold.take_over = run.own_owner
            s.acquired, s.ended = self._acquire(hold, 0.0, run.mark)
            s.took_over = s.acquired
            if s.acquired:
                log.warning("%s[%s] %s on %r", self.name, request.id, action.why, hold.name)
            return
        if kind == run_model.WAIT:
            run.found = None  # read again if the wait ends without the lock
            copy = self._mark_wait(hold, s.wait, run.node)
            if isinstance(copy, own_holds.Verdict):
                s.waited, s.copy_waiting = True, copy
                return
            try:
                s.acquired, s.ended = self._acquire(hold, s.wait, run.mark)
            finally:
                waiting_marks.remove(self.lock_client.connection, copy)
            s.waited, s.held_by_call = True, hold.held_by_call
            return
        raise AssertionError(f"not an observation: {action}")

    def _act(
        self, action: run_model.Action, s: run_model.Snapshot, run: _Run, waited: float
    ) -> Any:
        """End the delivery as ``action`` says."""
        request, hold, kind = self.request, run.hold, action.kind
        if kind == run_model.RUN:
            if action.why:
                log.warning("%s[%s] %s", self.name, request.id, action.why)
            track_run_lock(hold)
            lock_acquired.send(
                sender=self, name=hold.name, task_id=request.id, hold=hold, wait=waited
            )
            return self._run_holding(hold, run.args, run.kwargs, run.mark)
        if kind == run_model.RUN_UNLOCKED:
            log.warning("running %s[%s] UNLOCKED: %s", self.name, request.id, run.error)
            return self._run_holding(None, run.args, run.kwargs)
        if kind == run_model.FAIL:
            exc = run.error
            assert exc is not None
            self._autoretry(exc)
            raise LockBackendError(
                f"{exc}; {self.name} did not run. To retry it when the lock Redis is "
                "back: autoretry_for=(LockBackendError,); to run it unlocked instead: "
                'lock_backend_down="run"',
                name=exc.name,
            ) from exc
        if kind == run_model.REPLACED:
            return self._replaced(hold, run.args, run.kwargs)
        if kind in (run_model.SKIP, run_model.CONFLICT_RAISE, run_model.CONFLICT_RETRY):
            return self._conflict(hold, kind, waited, run.found)
        self._give_back(hold)  # a copy that took the lock stores nothing
        if kind == run_model.REQUEUE:
            countdown = action.countdown
            if action.look_again == run_model.AFTER_LEASE:
                countdown = own_holds.look_again_in(self, self.lock_options.lease)
            elif action.look_again == run_model.AFTER_DELAY:
                assert s.own_delay_until_ms is not None
                countdown = own_holds.after_delay_in(self, s.own_delay_until_ms)
            own_holds.requeue(self, countdown, action.counted_in)
            log.info("%s[%s] %s; looks again in %.1f s", self.name, request.id, action.why,
                     countdown)  # fmt: skip
        else:
            log.info("%s[%s] %s", self.name, request.id, action.why)
        raise Ignore()

    def _give_back(self, hold: LockHandle) -> None:
        """Release what a delivery that does not run took (it runs out within its lease if
        Redis does not answer)."""
        if not hold.held:
            return
        try:
            hold.release()
        except LockError as exc:
            log.warning("%s[%s] could not give back %r: %s", self.name, self.request.id,
                        hold.name, exc)  # fmt: skip

    def _leave_queue_at_acquire(self, hold: LockHandle) -> bool:
        """``until_start``/``debounce``: True if the queue claim is freed by the run lock's
        first acquire (same round trip); else :meth:`_leave_queue` frees it first. A retry
        frees it too: attempt 0 may have failed before it could (the lock Redis did not
        answer as it started)."""
        return isinstance(hold, Lease) and claims.free_at_acquire(
            hold, self.request.id, stop_if_replaced=self._replaceable()
        )

    def _replaceable(self) -> bool:
        """Whether a later call may replace this one in the queue: ``debounce``, and not a
        retry (which continues a call that started)."""
        return self.lock_options.on_enqueue == DEBOUNCE and not self.request.retries

    def _replaced_at_acquire(self, hold: LockHandle) -> bool:
        """``debounce``: True if a later call took this one's queue claim over, so the first
        acquire stopped there. ``until_start`` never replaces a call it let into the queue: a
        claim another call holds by then (this one's ran out or was freed) changes nothing,
        and the run honours ``lock_wait`` and ``lock_conflict`` as any other; nor is a retry,
        which continues a call that started."""
        return isinstance(hold, Lease) and self._replaceable() and claims.replaced_at_acquire(hold)

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

    def _replaced(self, hold: LockHandle, args: Any, kwargs: Any) -> Any:
        name = hold.name
        try:
            latest = claims.replaced_by(self, args, kwargs)
        except LockError:
            latest = None
        why = f"replaced by queued task {latest}"
        return self._skip(name, latest, why, 0.0, logged=why)

    def _done_mark(self, hold: LockHandle) -> done_marks.DoneMark | None:
        """The done mark (done_marks.py) of the running attempt, in ``hold``'s slot; None
        when ``singleton_lock_done_mark_ttl`` is 0 (no marks)."""
        ttl = self._done_mark_ttl
        if not ttl:
            return None
        request, connection = self.request, self.lock_client.connection
        return done_marks.DoneMark.of(
            connection,
            hold,
            request.id,
            request.retries or 0,
            ttl,
            sends.send_of(request),
            done_marks.delivery_id(request),
            done_marks.copies_can_come(self, request),
        )

    @cached_property
    def _broker_marks_redeliveries(self) -> bool:
        """Whether this app's broker marks a message it delivers again (sends.py)."""
        return sends.marks_redeliveries(self.app)

    @cached_property
    def _done_mark_ttl(self) -> float:
        """Seconds this task's done marks last (0: none), from the app's settings."""
        return done_marks.mark_ttl(self.app)

    def _acquire(
        self, hold: LockHandle, wait: float, mark: done_marks.DoneMark | None
    ) -> tuple[bool, int]:
        """``hold.acquire(wait)``, reading the done ``mark`` (done_marks.py; None: marks
        off) in each attempt's round trip: whether it took the lock, and the highest attempt
        of this send that had ended (done_marks.NONE_ENDED if none)."""
        if mark is None:
            return hold.acquire(wait), done_marks.NONE_ENDED
        return done_marks.acquire(self.lock_client.connection, hold, wait, mark)

    def _mark_wait(
        self, hold: LockHandle, wait: float, node: str | None
    ) -> waiting_marks.Mark | own_holds.Verdict:
        """Mark that this delivery waits up to ``wait`` seconds for the lock
        (waiting_marks.py): the mark, to remove when the wait ends; or, when another delivery
        of this message waits already, the verdict re-queueing this copy (it would run the
        body a second time once its original ran)."""
        request = self.request
        connection = self.lock_client.connection
        try:
            return waiting_marks.claim(
                connection,
                waiting_marks.mark_key(connection, hold, request.id, request.retries or 0),
                wait=wait,
                node=node,
                requeues=sends.requeues(request),
                max_countdown=own_holds.max_countdown(self.app),
            )
        except waiting_marks.CopyOfWaiting as copy:
            return copy.verdict()

    def _outcome_missing(self) -> bool:
        """Whether this call's outcome should be stored and the result backend has none
        (nothing, or only STARTED), or does not answer."""
        request = self.request
        if self.ignore_result or getattr(request, "ignore_result", False):
            return False
        if not claims.has_result_backend(self):
            return False
        return claims.result_state(self, request.id) in (None, "PENDING", "STARTED")

    def _record_end(self, hold: LockHandle) -> None:
        """Write the running attempt's done mark alone: its call ended without a release to
        send it with (skipped, refused, retried)."""
        mark = self._done_mark(hold)
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

    def _run_holding(
        self,
        hold: LockHandle | None,
        args: Any,
        kwargs: Any,
        mark: done_marks.DoneMark | None = None,
    ) -> Any:
        runs: _RunLocks | None = self.__dict__.get("_lock_stack")
        if runs is None:
            # Not setdefault(name, _RunLocks()) alone: that would make a new local per run.
            runs = self.__dict__.setdefault("_lock_stack", _RunLocks())
        runs.holds.append(hold)
        # Whether the body ended by itself (returned, raised an error): only then is the
        # attempt marked done. Cut short (SystemExit, a signal) or handing the message on
        # (Ignore, Reject: Task.replace keeps the task id), a redelivery runs it again.
        ended = False
        try:
            # A base class's own __call__ (a transaction, a tenant context) runs here, inside
            # the lock; it reaches Celery's Task.__call__, which in a worker claims the
            # tracer's request as _called_by_tracer does.
            if self._plain_call_after and self._called_by_tracer():
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
            runs.holds.pop()
            retries = _take_deferred(hold)
            if retries:
                self._send_deferred_retries(hold, retries, ended=ended)
            elif hold is not None and (hold.held or hold.lost):
                self._release(hold, ended=ended, mark=mark)

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

    def _release(
        self, hold: LockHandle, *, ended: bool = True, mark: done_marks.DoneMark | None = None
    ) -> None:
        """Release the run's lock; if its call ``ended``, with the attempt's done mark
        (``mark``, else made here) written first in the same round trip (done_marks.py)."""
        try:
            if not ended:
                mark = None
            elif mark is None:
                mark = self._done_mark(hold)
            if mark is not None:
                connection = self.lock_client.connection
                done_marks.release(connection, hold, self.lock_options.release_delay, mark)
            else:
                hold.release(delay=self.lock_options.release_delay)
        except LockLost as exc:
            # Not released by this run: lock_lost was sent (on_lost) when it was found lost.
            if exc.reason == "max_hold":
                log.error(
                    "%s[%s] ran past lock_ttl (%g s), the cap on one run's hold: lock_ttl "
                    "reached, its lock ran out then; raise lock_ttl for runs this long",
                    self.name, self.request.id, self.lock_options.max_hold,
                )  # fmt: skip
                return
            log.error("%s[%s] ran without its lock at the end: %s", self.name, self.request.id, exc)
            return
        except LockError as exc:
            log.warning(
                "%s[%s] could not release %r: %s", self.name, self.request.id, hold.name, exc
            )
            return
        lock_released.send(sender=self, name=hold.name, task_id=self.request.id, hold=hold)

    def _conflict(
        self, hold: LockHandle, kind: str, waited: float, found: list[HolderRecord] | None
    ) -> Any:
        """The key is taken by another call: skip (the skipped result), raise LockTimeout or
        retry, as ``kind`` says; the attempt is marked done (done_marks.py) either way."""
        name = hold.name
        if found is None:
            found = holders.holders_of(hold)
        why = holders.describe(found)
        if kind != run_model.SKIP:
            exc = LockTimeout(f"{self.name}: lock {name!r} is taken ({why})", name=name)
            if kind == run_model.CONFLICT_RAISE:
                self._record_end(hold)
                raise exc
            try:
                raise self.retry(countdown=self.lock_options.retry_countdown, exc=exc)
            finally:
                # Once the retry is sent (or refused: the call failed): a copy of this
                # attempt must not run beside the retry.
                self._record_end(hold)
        holder = holders.holder_task_id(found)
        self._record_end(hold)
        return self._skip(name, holder, why, waited, logged=f"lock {name!r} {why}")

    def _skip(self, name: str, holder: str | None, why: str, waited: float, logged: str) -> Any:
        """Skip the body: log, send ``lock_skipped`` and return the skipped result."""
        task_id = self.request.id
        log.info("%s[%s] skipped: %s", self.name, task_id, logged)
        lock_skipped.send(
            sender=self, name=name, task_id=task_id, hold=None, wait=waited, holder=holder
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
        hold = self.lock
        call = dict(args=args, kwargs=kwargs, exc=exc, throw=throw, eta=eta, countdown=countdown)
        call.update(max_retries=max_retries, **options)
        if hold is not None and self._superseded(hold):
            raise Ignore()
        if hold is None or not hold.held:
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
            _deferred_retries.pending.extend((hold, send) for send in captured)
            return outcome
        request = self.request
        if countdown is None and eta is None:
            until_run = float(self.default_retry_delay or 0)
        else:
            until_run = enqueue.seconds_until(eta, countdown)
        next_owner, handed = self._hand_over(
            hold,
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
                self._record_end(hold)
                raise
        try:
            return super().retry(**call)
        except Retry:
            if handed:
                lock_released.send(sender=self, name=hold.name, task_id=request.id, hold=hold)
            # The retry is sent: this attempt ended (its claim kept copies out until now).
            self._record_end(hold)
            raise
        except BaseException as exc:
            # No retry was sent (max_retries reached, broker error): this run was the last,
            # so its claim goes as the run's own lock would, release delay included, after
            # the attempt's done mark (none if the run was cut short); also a claim whose
            # hand-over was not answered, which may be there all the same.
            if isinstance(exc, Exception):
                self._record_end(hold)
            claims.release_handed_over(self, hold.name, next_owner, self.lock_options.release_delay)
            raise

    def _superseded(self, hold: LockHandle) -> bool:
        """Whether this run lost its lock to a copy of its own message (the same send: a
        broker's copy took its dead-looking hold over while it was paused past its lease).
        The copy carries the call on; a retry sent from here would take the copy's hold over
        as an earlier attempt's and run beside it, so none is sent. One read, on a lost
        lock's retry only."""
        if not hold.lost:
            return False
        request, owner = self.request, hold.owner
        superseded = any(
            holder.owner != owner
            and not holder.waiting
            and holder.release_delay_until_ms is None
            and sends.same_call(holder.task_id, holder.send, request)
            for holder in holders.holders_of(hold)
        )
        if superseded:
            log.warning(
                "%s[%s] sends no retry: it lost %r to a copy of its own message, which goes on",
                self.name, request.id, hold.name,
            )  # fmt: skip
        return superseded

    def _send_deferred_retries(
        self, hold: LockHandle | None, retries: list[_RetrySend], *, ended: bool = True
    ) -> None:
        """The body ended: pass the run's lock to the retry kept back by
        ``retry(throw=False)`` (or release it: another key, another kind), then send it;
        then mark the attempt done if the body ``ended`` by itself."""
        request = self.request
        for args, kwargs, task_id, options, called_at in retries:
            options = dict(options)
            if options.get("countdown") is not None:
                # Counted from the retry() call, as Celery would have sent it then.
                options["countdown"] = max(
                    0.0, float(options["countdown"]) - (time.monotonic() - called_at)
                )
            next_owner, handed = None, False
            if hold is not None and self._superseded(hold):
                continue
            if hold is not None and hold.held:
                next_owner, handed = self._hand_over(
                    hold,
                    args,
                    kwargs,
                    int(options.get("retries") or (request.retries or 0) + 1),
                    enqueue.seconds_until(options.get("eta"), options.get("countdown")),
                )
            elif hold is not None and hold.lost:
                self._release(hold, ended=ended)  # reports it lost
            try:
                self.apply_async(args, kwargs, task_id=task_id, **options)
            except Exception as exc:
                # Celery would have rejected the run at the retry() call; the body has ended.
                log.error("%s[%s] could not send its retry: %s", self.name, request.id, exc)
                if next_owner is not None and hold is not None:
                    claims.release_handed_over(
                        self, hold.name, next_owner, self.lock_options.release_delay
                    )
                continue
            if handed and hold is not None:
                lock_released.send(sender=self, name=hold.name, task_id=request.id, hold=hold)
        if ended and hold is not None:
            self._record_end(hold)

    def _hand_over(
        self, hold: LockHandle, args: Any, kwargs: Any, attempt: int, until_run: float
    ) -> tuple[str | None, bool]:
        """Hand the run's ``hold`` to attempt ``attempt``, the retry with these
        arguments that may run in ``until_run`` seconds. Returns its claim's owner token
        (None if the lock was released instead or lost already: the retried run then takes
        the lock for itself) and whether Redis answered that it was handed over."""
        request = self.request
        if not isinstance(hold, Lease) or hold.name != self.lock_name(args, kwargs):
            # Another key, or a kind with no claims (read/write, range, multi): let go now,
            # unmarked (the caller marks the attempt once its retry is sent).
            self._release(hold, ended=False)
            return None, False
        try:
            owner = claims.hand_over(
                self, hold, request.id, attempt, until_run + self.lock_options.max_hold
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

    # -- replace: the call goes on in another message -----------------------------------------

    def on_replace(self, sig: Any) -> Any:
        """As :meth:`celery.Task.on_replace`, which sends the replacement under this task id:
        the run's lock is let go first, with no release delay and no done mark (the call has
        not ended: it goes on in the replacement), and the replacement is a new send
        (sends.py), so it is neither taken for a copy of this run nor kept out by its lock."""
        hold = self.lock
        if hold is not None and (hold.held or hold.lost):
            try:
                hold.release()
            except LockLost as exc:
                log.error("%s[%s] ran without its lock at the end: %s", self.name,
                          self.request.id, exc)  # fmt: skip
            except LockError as exc:  # it runs out within its lease
                log.warning("%s[%s] could not release %r before its replacement: %s",
                            self.name, self.request.id, hold.name, exc)  # fmt: skip
            else:
                lock_released.send(sender=self, name=hold.name, task_id=self.request.id, hold=hold)
        _drop_send_id(sig)
        return super().on_replace(sig)

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
        # Every copy of this message carries its send id; a retry keeps its call's (sends.py).
        options = sends.stamp(options)
        send = super().apply_async
        if (
            not self.lock_options.on_enqueue
            or self.app.conf.task_always_eager
            or enqueue.continues_running_call(self, task_id)
        ):
            return send(args, kwargs, task_id=task_id, **options)
        return enqueue.send_once(self, send, args, kwargs, task_id, options)

    def free_claim(self, args: Any, kwargs: Any, *, task_id: str, attempt: int) -> bool:
        """Free the claim that attempt ``attempt`` of task ``task_id`` (a call with these
        arguments) holds for its queued message, if it still holds it: the message will not
        run (revoked, expired). True if a claim was freed."""
        freed = claims.free_claim(self, args, kwargs, task_id=task_id, attempt=attempt)
        return freed == ReleaseResult.RELEASED


def _drop_send_id(sig: Any) -> None:
    """Drop a send id the replacement signature ``sig`` (or a member of its canvas) may have
    copied from the running request: each message it makes is a new send."""
    members = getattr(sig, "tasks", None)
    for member in [sig, *(members if isinstance(members, (list, tuple)) else ())]:
        options = getattr(member, "options", None)
        if isinstance(options, dict) and options.get("headers"):
            options.update(sends.unstamped(options))


def _plain_call_after(cls: type) -> bool:
    """Whether the first ``__call__`` after SingletonTask's in ``cls``'s method order is
    Celery's ``Task.__call__`` (checked by class: a worker replaces that function), not a
    base class's own (``class Locked(SingletonTask, MyBase)``, or a task
    ``singleton_lock_tasks`` converted, whose class follows SingletonTask)."""
    mro = cls.__mro__
    for klass in mro[mro.index(SingletonTask) + 1 :]:
        if "__call__" in klass.__dict__:
            return klass is Task
    return True


def _take_deferred(hold: LockHandle | None) -> list[_RetrySend]:
    """The retry messages ``retry(throw=False)`` kept back in the run holding ``hold``,
    taken off this thread's list."""
    pending = _deferred_retries.pending
    if not pending or hold is None:
        return []
    mine = [send for held, send in pending if held is hold]
    if mine:
        pending[:] = [(held, send) for held, send in pending if held is not hold]
    return mine


for _option in OPTIONS:
    setattr(SingletonTask, _option.name, None)
SingletonTask.__doc__ = (SingletonTask.__doc__ or "") + "".join(
    f"\n\n    ``{option.name}``: {option.doc}" for option in OPTIONS
)
del _option
