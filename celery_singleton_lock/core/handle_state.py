"""The state machine of a lock handle, without I/O: shared by the sync and asyncio handles.

:class:`HandleState` holds what a handle knows (its owner token, the process that took it,
its fencing token, when its lease runs out locally, whether it was found lost) and makes every
decision about it: what an acquire reply, a release code, an extend or renewal reply does to
the state, what to raise, log and announce, how long a waiter sleeps. It never talks to Redis
and never sleeps: the operations (:mod:`.handle_ops`) feed it the replies of the script
calls that the runners (:class:`.handle.LockHandle` with threads,
``aio.handle.AsyncLockHandle`` with asyncio) make.

Every change of the state is made under ``self._state_lock``: a ``threading.Lock`` in the sync
handle, where the heartbeat thread reports renewals while the owner's thread releases or
extends; :data:`NO_LOCK` in the asyncio handle, whose callbacks all run on its event loop.
"""

from __future__ import annotations

import logging
import math
import os
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..exceptions import (
    LockBackendError,
    LockError,
    LockExpired,
    LockLost,
    LockNotHeld,
    LockTaken,
    LockTimeout,
)
from . import validate
from .replies import Reply

log = logging.getLogger("celery_singleton_lock.lease")
lost_log = logging.getLogger("celery_singleton_lock.lost")

#: A waiter whose holder has no expiry (never made by this package) looks again this often.
NO_EXPIRY_RECHECK = 1.0


@dataclass(frozen=True)
class Timing:
    """A handle's checked lease length and max-hold, in seconds and in the scripts' ms."""

    ttl: float
    ttl_ms: int
    max_hold: float | None
    max_hold_ms: int

    @classmethod
    def check(cls, ttl: float, max_hold: object) -> Timing:
        """From a ``ttl`` already checked by ``check_positive`` and a ``max_hold`` to check;
        raises ConfigurationError as a handle's constructor does."""
        hold = validate.check_max_hold(max_hold, ttl)
        hold_ms = 0 if hold is None else validate.seconds_to_ms(hold)
        return cls(ttl, validate.seconds_to_ms(ttl), hold, hold_ms)


#: The Timing of the default ``ttl`` (30 s) and no ``max_hold``: checked once, not per handle.
DEFAULT_TIMING = Timing.check(30.0, None)


class Options(NamedTuple):
    """A handle's constructor arguments, checked (see :func:`check_options`)."""

    name: str
    timing: Timing
    heartbeat: bool
    wait: float
    owner_info: dict[str, str]
    on_lost: Any


def check_options(
    name: object,
    ttl: object,
    heartbeat: object,
    max_hold: object,
    wait: object,
    owner_info: object,
    on_lost: object,
) -> Options:
    """The arguments every handle constructor takes, checked in this order; raises
    ConfigurationError naming the first bad one."""
    checked_name = validate.check_name(name)
    # The defaults, as most handles are made: their Timing is checked once.
    default_timing = type(ttl) is float and ttl == DEFAULT_TIMING.ttl and max_hold is None
    checked_ttl = DEFAULT_TIMING.ttl if default_timing else validate.check_positive(ttl, "ttl")
    checked_heartbeat = validate.check_bool(heartbeat, "heartbeat")
    return Options(
        checked_name,
        DEFAULT_TIMING if default_timing else Timing.check(checked_ttl, max_hold),
        checked_heartbeat,
        validate.check_wait(wait),
        validate.check_owner_info(owner_info),
        validate.check_callable(on_lost, "on_lost"),
    )


class OptionNames(NamedTuple):
    """What a handle's messages call its ``ttl`` and ``max_hold``: the words of whoever
    set them. A layer that makes handles from options of its own (SingletonTask: a run's
    lease is ``lock_lease``, its cap ``lock_ttl``) sets the handle's ``option_names``, so
    that a user reads, and is told to raise, the option they wrote."""

    ttl: str = "ttl"
    max_hold: str = "max_hold"


#: The names of a handle made from ``ttl=`` and ``max_hold=`` arguments.
ARGUMENT_NAMES = OptionNames()


class _Process:
    """This process's id, kept current across fork: ``os.getpid()`` is a system call, and
    every acquire and release asks whether the handle belongs to this process."""

    pid = os.getpid()

    @classmethod
    def forked(cls) -> None:
        cls.pid = os.getpid()


os.register_at_fork(after_in_child=_Process.forked)


#: The ``_state_lock`` of a handle whose state changes all run on one thread (an event loop's).
NO_LOCK: AbstractContextManager[Any] = nullcontext()


def hint_seconds(hint_ms: int) -> float:
    """How long a waiter may sleep before a conflicting lease could have run out."""
    if hint_ms < 0:
        return NO_EXPIRY_RECHECK
    return (hint_ms + 1) / 1000


#: The pauses of a waiter between attempts Redis did not answer (a failover, a restart):
#: the first soon, then doubling to the longest.
OUTAGE_FIRST_PAUSE, OUTAGE_LONGEST_PAUSE = 0.05, 1.0


class Outage:
    """A waiter's run of attempts Redis did not answer (a failover, a restart). A waiter holds
    nothing, so it keeps trying within its wait, as the same owner (a re-sent attempt is
    answered as the first), and takes the lock on the server that answers next."""

    __slots__ = ("_deadline", "_failures")

    def __init__(self, deadline: float) -> None:
        self._deadline = deadline  # monotonic: the end of the wait
        self._failures = 0

    def pause(self, error: LockBackendError) -> float:
        """The pause before trying again after ``error``: the first soon, then doubling to
        the longest; raises ``error`` when the wait ends first (Redis did not answer
        within it)."""
        self._failures += 1
        pause = min(OUTAGE_FIRST_PAUSE * (1 << min(self._failures - 1, 16)), OUTAGE_LONGEST_PAUSE)
        if time.monotonic() + pause >= self._deadline:
            raise error
        return pause

    def answered(self) -> None:
        """Redis answered: the next outage's pauses start short again."""
        self._failures = 0


def retry_in(deadline: float, hint_ms: int) -> float | None:
    """How long a waiter whose attempt failed with ``hint_ms`` sleeps (unless a release
    wakes it first) before it tries again; None once the monotonic ``deadline`` passed."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return None
    return min(hint_seconds(hint_ms), remaining)


class HandleState:
    """The state and the decisions of a lock handle (see the module docstring).

    A driver sets the options with :meth:`_configure` and provides ``_state_lock`` (its state
    lock) and the hooks ``_start_renewing``, ``_stop_renewing``, ``_call_on_lost`` and
    ``_describe_holder``; it calls the ``_begin_*`` methods before a round trip and the methods
    named for a reply (``_took``, ``_released``, ``_extended``, ``_renewed``) after one.
    """

    # Handles are made per use (``with client.lease(name):``): slots make them cheaper to
    # build and smaller. A driver adds its own.
    __slots__ = (
        "name", "ttl", "heartbeat", "max_hold", "wait", "owner_info", "on_lost",
        "_max_hold_ms", "_gen", "_ttl_ms", "_renewal", "_first_lease",
        "_owner", "_pid", "_token", "_lost", "_expires_at", "_hold_ends_at", "_release_unanswered",
        "_held_by_call", "option_names", "_cap_reached",
        "__weakref__",  # the heartbeats hold handles by weak reference
    )  # fmt: skip

    kind = "lease"
    #: Why a lease ran out unrenewed, in the error check() raises (where renewals stall;
    #: the cap, max_hold, is said apart, in the handle's option_names).
    _stall_causes = "process paused or Redis unreachable"

    _state_lock: AbstractContextManager[Any]
    name: str
    ttl: float
    heartbeat: bool
    max_hold: float | None
    wait: float
    owner_info: dict[str, str]
    on_lost: Any

    def _configure(self, options: Options) -> None:
        """Set a new handle's options (checked) and an empty state."""
        timing = options.timing
        self.name = options.name
        #: Seconds the lock lasts unless renewed; the heartbeat renews it to this length.
        self.ttl = timing.ttl
        self.heartbeat = options.heartbeat
        #: Seconds after acquisition past which the lock is no longer renewed (None: never).
        self.max_hold = timing.max_hold
        #: Default seconds ``acquire`` waits for a busy lock (``math.inf``: forever).
        self.wait = options.wait
        self.owner_info = options.owner_info
        #: Called with this handle when it is found lost (see the driver's docstring).
        self.on_lost = options.on_lost
        #: What messages call ``ttl`` and ``max_hold`` (see :class:`OptionNames`).
        self.option_names = ARGUMENT_NAMES
        self._max_hold_ms = timing.max_hold_ms
        # The generation of the renewals: raised by each extend, so that a renewal read
        # before an extend and answered after it is told apart (see _renewed).
        self._gen = 0
        self._set_ttl(timing.ttl, timing.ttl_ms)
        self._owner: str | None = None
        self._pid = 0
        self._token: int | None = None
        self._lost: LockLost | None = None
        self._expires_at = 0.0  # monotonic; a conservative local view of the server's expiry
        # Monotonic time from which max_hold may have ended the hold (math.inf: no max_hold):
        # a lease found gone from then on ran out at its max_hold, and says so.
        self._hold_ends_at = math.inf
        # A renewal answered that max_hold was reached: the lease runs out at the cap.
        self._cap_reached = False
        # A release round trip failed: it may have run with its reply lost.
        self._release_unanswered = False
        # The last acquire met a hold of this handle's call identity (see held_by_call).
        self._held_by_call = False

    # -- what a driver provides --------------------------------------------------------------

    def _new_owner(self) -> str:
        """The owner token of the next acquisition: random, unique per acquisition."""
        return os.urandom(16).hex()

    def _start_renewing(self) -> None:
        """Have the heartbeat renew this handle (again: its tick period may have changed)."""
        raise NotImplementedError

    def _stop_renewing(self) -> None:
        """Have the heartbeat stop renewing this handle."""
        raise NotImplementedError

    def _call_on_lost(self) -> None:
        """Run ``on_lost`` (set) for this handle, just found lost."""
        raise NotImplementedError

    def _describe_holder(self, *, named: bool = True) -> list[Any]:
        """Field, value pairs the acquire scripts store about the holder (``holder_fields``);
        without ``name`` when ``named`` is false."""
        raise NotImplementedError

    # -- public state ------------------------------------------------------------------------

    @property
    def token(self) -> int | None:
        """The fencing token of the current (or last) acquisition: strictly increasing for
        this name across every acquisition by anyone, sync or async. Pass it to storage that
        rejects writes carrying a smaller token than it has seen."""
        return self._token

    @property
    def owner(self) -> str | None:
        """The owner token this handle holds the lock under, None when it holds nothing: the
        token a holder record names (``celery locks``), a fixed one given as ``owner``, or a
        fresh random one per acquisition."""
        return self._owner if self._mine() else None

    @property
    def held(self) -> bool:
        """True while this handle holds the lock, as far as this process can tell."""
        return self._mine() and self._lost is None and time.monotonic() < self._expires_at

    @property
    def held_by_call(self) -> bool:
        """True when the last ``acquire`` returned False because a hold of this handle's
        call identity (the ``call`` option of the shared kinds: read, upgradable and
        range holds, permits) stands on the lock: another acquire of the very same call
        holds it. Such a hold is never waited for. Always False for kinds with no call
        identity."""
        return self._held_by_call

    def _refused_for_call(self, hint_ms: int) -> tuple[bool, int]:
        """An acquire attempt answered ``Reply.HELD_BY_CALL`` (a hold of this
        handle's call identity has ``hint_ms`` left): the attempt's outcome, not taken."""
        self._held_by_call = True
        return False, hint_ms

    @property
    def lost(self) -> bool:
        """True once the lock is known lost: found gone or taken by a renewal, or its time
        ran out without a renewal (a paused process or blocked event loop, Redis unreachable,
        max-hold passed)."""
        if self._lost is not None:
            return True
        return self._mine() and time.monotonic() >= self._expires_at

    def check(self) -> None:
        """Raise :class:`LockLost` if the lock is lost, :class:`LockNotHeld` if it is not
        held. No round trip: cheap enough for the inner loop of a long task."""
        if self._lost is not None:
            raise self._lost.with_traceback(None)
        if not self._mine():
            raise LockNotHeld(f"lock {self.name!r} is not held", name=self.name)
        if time.monotonic() >= self._expires_at:
            if self._past_cap():
                # As the heartbeat or the release would find it: the cap, not a stall.
                error = self._lost_error(Reply.GONE, "check")
            else:
                cap = self.option_names.max_hold
                error = LockExpired(
                    f"lease on {self.name!r} ran out before it was renewed "
                    f"({self._stall_causes}, or {cap} reached)",
                    name=self.name,
                )
            self._mark_lost(self._owner, error)
            assert self._lost is not None
            raise self._lost.with_traceback(None)

    def __repr__(self) -> str:
        state = "lost" if self.lost else "held" if self.held else "free"
        return f"<{type(self).__name__} {self.name!r} {state} token={self._token}>"

    def _set_ttl(self, ttl: float, ttl_ms: int) -> None:
        """The lease length renewals (and the next acquire) ask for."""
        self.ttl, self._ttl_ms = ttl, ttl_ms
        #: (lease length in ms, generation) of the next renewal, read by the heartbeat in
        #: one go: a renewal of a generation always asks for that generation's length.
        self._renewal = (ttl_ms, self._gen)
        # Seconds the next acquisition holds before its first renewal: worked out here
        # rather than on every acquire.
        self._first_lease = min(ttl_ms, self._max_hold_ms or math.inf) / 1000

    # -- acquire -----------------------------------------------------------------------------

    def _begin_acquire(self, wait: float | None) -> tuple[float, str]:
        """Before an acquire's first attempt: the seconds it may wait, and its owner token."""
        wait = self.wait if wait is None else validate.check_wait(wait)
        # _mine() inlined here and in _forget: both are on every acquire and release.
        if self._owner is not None and self._pid == _Process.pid and self._lost is None:
            raise LockError(f"lock {self.name!r} is already held by this handle", name=self.name)
        self._held_by_call = False
        return wait, self._new_owner()

    def _took(self, owner: str, token: int, sent_at: float) -> None:
        """An acquire attempt sent at ``sent_at`` (monotonic) took the lock as ``owner``."""
        with self._state_lock:
            self._owner = owner
            self._pid = _Process.pid
            self._token = token
            self._lost = None
            self._expires_at = sent_at + self._first_lease
            # From the send: the server's deadline (acquired + max_hold) is no earlier.
            self._hold_ends_at = sent_at + (self.max_hold or math.inf)
            self._cap_reached = False
        if self.heartbeat:
            self._start_renewing()

    def _withdraw_failed(self, raising: BaseException | None) -> None:
        """A waiter that gave up could not withdraw its wait (Redis did not answer);
        ``raising`` is the error the acquire goes on to raise (None: it returns)."""
        if isinstance(raising, LockBackendError):
            # The caller hears that Redis does not answer from the acquire's own error: a
            # second message, with the client's internals, would only bury it.
            log.debug("could not withdraw the wait of %r", self.name, exc_info=True)
            return
        log.warning("could not withdraw the wait of %r", self.name, exc_info=True)

    # -- release -----------------------------------------------------------------------------

    def _begin_release(self, delay: float) -> tuple[str, int]:
        """Before a release's round trip: stop renewing and drop the owner token; the owner
        and the release delay in ms to send."""
        delay = validate.check_delay(delay)
        return self._forget(), validate.seconds_to_ms(delay) if delay > 0 else 0

    def _forget(self) -> str:
        """Stop renewing and drop the owner token (the first half of every release)."""
        if self._owner is None or self._pid != _Process.pid:
            raise LockNotHeld(f"lock {self.name!r} is not held", name=self.name)
        self._stop_renewing()
        with self._state_lock:
            owner, self._owner = self._owner, None
        assert owner is not None
        return owner

    def _release_unsent(self, owner: str) -> None:
        """A release round trip failed: it may not have reached Redis, so keep the owner
        token for a retry. Not renewed any more: a caller who gives up frees it within ttl."""
        with self._state_lock:
            if self._owner is None:
                self._owner = owner
            self._release_unanswered = True

    def _released(self, code: int) -> None:
        """The release script answered ``code``: DONE released, else raise the lost error."""
        unanswered, self._release_unanswered = self._release_unanswered, False
        if code == Reply.DONE:
            self._lost = None
            return
        error = self._lost_error(code, "release")
        if unanswered:
            # Found gone (or another's) by a release sent again, with no trace of the
            # earlier one freeing it (the release scripts of leases leave one, until the next
            # release of the name; those of the other kinds leave one in the hold's own hash,
            # until the hold would have run out): it may have, or the lease was lost before
            # it arrived.
            # The caller hears both, and the error stays (fail closed).
            reason = error.reason
            error = type(error)(
                f"{error}; an earlier release of it whose reply was lost may have been the "
                "one that freed it",
                name=self.name,
            )
            error.reason = reason
        # Found lost only now (a starved heartbeat, a paused process): on_lost fires here,
        # once, as it would have from the renewal that should have found it.
        with self._state_lock:
            first, self._lost = self._lost is None, self._lost or error
        if first:
            self._announce_lost(error)
        raise error

    # -- extend ------------------------------------------------------------------------------

    def _begin_extend(self, ttl: float | None) -> tuple[str, float, int, int]:
        """Before an extend's round trip: the owner to renew for, the ttl it asks for (capped
        at max_hold) in seconds and ms, and the new generation of renewals it starts. A
        lost handle raises its loss again.

        Renewals are ordered by generation. The extend takes the next one together with its
        ttl, before it is sent, so every renewal the heartbeat reads from now on asks for
        the new ttl. A renewal of an older generation (read before) never changes the lease
        on the server (renew.lua) nor this handle's view of it (:meth:`_renewed`), whichever
        lands or is read first; within one generation no renewal shortens the lease."""
        ttl = self.ttl if ttl is None else validate.check_positive(ttl, "ttl")
        if self.max_hold is not None and ttl > self.max_hold:
            ttl = self.max_hold
        if not self._mine():
            raise LockNotHeld(f"lock {self.name!r} is not held", name=self.name)
        if self._lost is not None:
            raise self._lost.with_traceback(None)
        owner = self._owner
        assert owner is not None
        ttl_ms = validate.seconds_to_ms(ttl)
        with self._state_lock:
            self._gen += 1
            gen = self._gen
            self._set_ttl(ttl, ttl_ms)
            # Until the extend has run the lease may already be shorter than this handle
            # thinks (it asks for less): no later than the new length from now.
            self._expires_at = min(self._expires_at, time.monotonic() + ttl)
        return owner, ttl, ttl_ms, gen

    def _extended(self, owner: str, code: int, sent_at: float, gen: int) -> float:
        """The renewal of generation ``gen`` an extend sent at ``sent_at`` answered
        ``code``: the seconds granted."""
        if code == Reply.MAX_HOLD_REACHED:
            return max(0.0, self._expires_at - time.monotonic())
        if code <= 0:
            error = self._lost_error(code, "extend")
            self._mark_lost(owner, error)
            raise error
        with self._state_lock:
            if self._lost is not None:  # found lost by the heartbeat meanwhile: stays lost
                raise self._lost.with_traceback(None)
            if gen == self._gen:  # else a later extend set the lease since
                self._expires_at = sent_at + code / 1000
        if self.heartbeat:
            self._start_renewing()  # the tick period may have changed
        return code / 1000

    # -- heartbeat callbacks -----------------------------------------------------------------

    def _renewed(self, owner: str | None, code: int, sent_at: float, gen: int) -> None:
        """The heartbeat's result for this handle; ``owner`` is the owner it renewed for,
        ``gen`` the generation of renewals it read (see :meth:`_begin_extend`)."""
        if code > 0:
            with self._state_lock:
                # A renewal of an older generation says nothing about the lease an extend
                # set since; within a generation no renewal shortens it, so the latest
                # deadline any of them vouches for holds (replies may be read out of order).
                if self._owner == owner and gen == self._gen:
                    self._expires_at = max(self._expires_at, sent_at + code / 1000)
        elif code == Reply.MAX_HOLD_REACHED:
            self._cap_reached = True
            self._stop_renewing()
            names = self.option_names
            log.info(
                "lock %r reached %s; it runs out within its %s",
                self.name, names.max_hold, names.ttl,
            )  # fmt: skip
        else:
            self._mark_lost(owner, self._lost_error(code, "heartbeat"))

    def _renewal_failed(self, owner: str | None, error: LockBackendError) -> None:
        """Redis did not answer a tick: keep trying until the lock would have expired."""
        if time.monotonic() >= self._expires_at:
            lost = LockExpired(
                f"lease on {self.name!r} ran out while Redis was unreachable: {error}",
                name=self.name,
            )
            lost.reason = "unreachable"
            self._mark_lost(owner, lost)

    def _mark_lost(self, owner: str | None, error: LockLost) -> None:
        """Found lost while held by ``owner``: record and announce it, unless the handle moved
        on meanwhile (released, acquired again) or was found lost already."""
        with self._state_lock:
            if self._owner != owner or self._lost is not None:
                return
            self._lost = error
        self._announce_lost(error)

    def _announce_lost(self, error: LockLost) -> None:
        """Stop renewing, log, and call ``on_lost`` (the handle was just marked lost)."""
        self._stop_renewing()
        # The reason's value stays "max_hold" (the signal's, the error's); the line says it
        # in the words of whoever set the cap.
        reason = self.option_names.max_hold if error.reason == "max_hold" else error.reason
        lost_log.warning("lock %r lost (%s): %s", self.name, reason, error)
        if self.on_lost is not None:
            self._call_on_lost()

    # -- context manager ---------------------------------------------------------------------

    def _timed_out(self) -> LockTimeout:
        """What entering the context raises when the lock was not acquired in time."""
        return LockTimeout(f"lock {self.name!r} not acquired within {self.wait} s", name=self.name)

    def _exit_release_failed(self, exc: BaseException | None) -> None:
        """Called in the ``except`` of a release that failed on leaving the context while
        ``exc`` (None: nothing) was propagating: re-raise the release's error if nothing
        was, else log it and let ``exc`` go on."""
        if exc is None:
            raise  # the release's error, which the caller is handling
        log.warning("release of %r failed while handling %r", self.name, exc, exc_info=True)

    # -- helpers -----------------------------------------------------------------------------

    def _mine(self) -> bool:
        return self._owner is not None and self._pid == _Process.pid

    def _past_cap(self) -> bool:
        """Whether max_hold may have ended the hold: a lease gone now ran out at its cap."""
        return self._cap_reached or time.monotonic() >= self._hold_ends_at

    def _lost_error(self, code: int, during: str) -> LockLost:
        if code == Reply.GONE and self._past_cap():
            cap = self.option_names.max_hold
            error = LockExpired(
                f"{during}: lease on {self.name!r} ran out at its {cap} ({self.max_hold:g} s):"
                f" it is not renewed past it; raise {cap} for longer holds",
                name=self.name,
            )
            error.reason = "max_hold"
            return error
        name = self.name
        if code == Reply.TAKEN:
            return LockTaken(f"{during}: lock {name!r} is held by another owner", name=name)
        assert code == Reply.GONE, code
        return LockExpired(f"{during}: lease on {name!r} expired and nobody holds it", name=name)
