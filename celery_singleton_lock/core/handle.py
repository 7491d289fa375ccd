"""What every lock handle shares: state, the wait loop, check, context manager, heartbeat
callbacks and the lost-lock bookkeeping.

A lock kind is a subclass supplying the abstract methods of :class:`LockHandle`: the round
trips ``_try_acquire(owner, reserve)``, ``_release(owner, delay_ms)``,
``_renew_script_call(conn, entries)`` and ``_release_holder(task_id, pid, host, delay)``, and
the ``_channel`` its releases are published on (and, for a kind holding keys in several
Redis Cluster slots, ``_renew_units``). Everything else — when a handle is
held or lost, how a blocked acquire sleeps, what the heartbeat does with a renewal code — is
written once here, so every lock kind behaves like the exclusive :class:`Lease`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

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
from .connection import Connection, HasConnection, connection_of
from .heartbeat import RenewEntry as RenewEntry  # where the kinds used to import it from
from .heartbeat import RenewUnit, heartbeat, renew_calls, renewing
from .keys import encode_name
from .scripts import GONE, MAX_HOLD_REACHED, TAKEN, ScriptCall, run_batch

log = logging.getLogger("celery_singleton_lock.lease")
lost_log = logging.getLogger("celery_singleton_lock.lost")


@dataclass(frozen=True)
class HolderRecord:
    """One holder of what a handle locks, as Redis has it (see :meth:`LockHandle.holders`)."""

    #: The holder's owner token (None: a delay-after, which no one owns).
    owner: str | None
    #: The ``task_id`` of its holder record, if it has one.
    task_id: str | None
    #: Server time (ms) at which a delay-after ends; None when this is not a delay-after.
    cooldown_until_ms: int | None = None
    #: A writer waiting for its turn: it holds nothing yet but keeps new readers out.
    waiting: bool = False


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


HOSTNAME = socket.gethostname()


class _Process:
    """This process's id, kept current across fork: ``os.getpid()`` is a system call, and
    every acquire and release asks whether the handle belongs to this process."""

    pid = os.getpid()

    @classmethod
    def forked(cls) -> None:
        cls.pid = os.getpid()


os.register_at_fork(after_in_child=_Process.forked)

#: Keys of ``owner_info`` stored as fields of their own (admin columns, lookups by task);
#: the rest is stored as one JSON field, ``info``.
OWN_INFO_FIELDS = ("task_name", "task_id", "worker")

#: A waiter whose holder has no expiry (never made by this package) looks again this often.
NO_EXPIRY_RECHECK = 1.0

H = TypeVar("H", bound="LockHandle")


class LockHandle(ABC):
    """Base of every expiring lock handle (lease, read/upgradable/write, range, multi).

    Not made directly: :class:`LockClient` has a factory per kind. ``acquire`` takes the lock,
    ``release`` gives it back, and while it is held the process's heartbeat renews it every
    ``ttl / 3`` seconds, so a holder that dies frees it within ``ttl``. Used as a context
    manager it acquires (waiting up to ``wait`` seconds, else raising :class:`LockTimeout`)
    and releases on exit.
    """

    kind = "lease"

    def __init__(
        self,
        client: Connection | HasConnection,
        name: str,
        *,
        ttl: float = 30.0,
        heartbeat: bool = True,
        max_hold: float | None = None,
        wait: float = 0.0,
        owner_info: dict[str, Any] | None = None,
        on_lost: Callable[[Any], object] | None = None,
    ) -> None:
        name = validate.check_name(name)
        ttl = validate.check_positive(ttl, "ttl")
        heartbeat = validate.check_bool(heartbeat, "heartbeat")
        self._setup(
            name,
            Timing.check(ttl, max_hold),
            heartbeat=heartbeat,
            wait=validate.check_wait(wait),
            owner_info=validate.check_owner_info(owner_info),
            on_lost=validate.check_callable(on_lost, "on_lost"),
            conn=connection_of(client),
        )

    def _setup(
        self,
        name: str,
        timing: Timing,
        *,
        heartbeat: bool,
        wait: float,
        owner_info: dict[str, str],
        on_lost: Callable[[Any], object] | None,
        conn: Connection,
    ) -> None:
        """Set a new handle's state from checked values: ``__init__``, or a kind's constructor
        for values checked once for many handles (the Celery layer's per-run lease)."""
        self.name = name
        #: Seconds the lock lasts unless renewed; the heartbeat renews it to this length.
        self.ttl = timing.ttl
        self.heartbeat = heartbeat
        #: Seconds after acquisition past which the lock is no longer renewed (None: never).
        self.max_hold = timing.max_hold
        #: Default seconds ``acquire`` waits for a busy lock (``math.inf``: forever).
        self.wait = wait
        self.owner_info = owner_info
        #: Called with this handle when it is found lost: from a heartbeat thread, or from the
        #: thread whose check() or extend() found it.
        self.on_lost = on_lost
        self._conn = conn
        self._ttl_ms = timing.ttl_ms
        self._max_hold_ms = timing.max_hold_ms
        self._state = threading.Lock()
        self._owner: str | None = None
        self._pid = 0
        self._token: int | None = None
        self._lost: LockLost | None = None
        self._expires_at = 0.0  # monotonic; a conservative local view of the server's expiry
        # (named, pid, thread ident) -> the holder fields of _describe_holder.
        self._holder_cache: dict[tuple[bool, int, int], list[Any]] = {}

    # -- what a subclass provides ------------------------------------------------------------

    #: The pub/sub channel releases of this lock are published on.
    _channel: bytes

    def _new_owner(self) -> str:
        """The owner token of the next acquisition: random, unique per acquisition."""
        return os.urandom(16).hex()

    @abstractmethod
    def _try_acquire(self, owner: str, reserve: bool) -> tuple[bool, int]:
        """One acquire round trip: (True, token) or (False, ms a waiter may sleep).
        ``reserve``: the caller will wait, so a writer may queue a reservation."""

    def _abandon(self, owner: str) -> None:  # noqa: B027 - optional: a no-op unless overridden
        """The caller stopped waiting: drop whatever ``_try_acquire`` reserved."""

    @abstractmethod
    def _release(self, owner: str, delay_ms: int) -> int:
        """One release round trip: 1 released, else GONE or TAKEN."""

    @classmethod
    @abstractmethod
    def _renew_script_call(cls, conn: Connection, entries: list[RenewEntry]) -> ScriptCall:
        """One script call renewing ``entries``; its reply has one code per entry."""

    def _renew_units(self, owner: str, ttl_ms: int) -> list[RenewUnit]:
        """On a Redis Cluster, this handle's renewal in units of one slot each: by default
        the whole handle, renewed by its class in the slot of its channel (every key of a
        one-name kind shares that slot)."""
        return [(type(self)._renew_script_call, self._channel, (self, owner, ttl_ms))]

    @abstractmethod
    def _release_holder(self, task_id: str, pid: int, host: str | None, delay: float) -> bool:
        """Release what run ``task_id`` in process ``pid`` on ``host`` (None: this machine)
        holds of this lock (not through this handle: for a supervisor whose child died
        holding it); True if released."""

    @abstractmethod
    def holders(self) -> list[HolderRecord]:
        """Who holds what this handle locks now (every name of a multi-key lock, every hold
        of a reader-writer or range lock, a delay-after), in no set order; empty when it is
        free. A read of a round trip or two, for the conflict path (who is in the way).
        Raises :class:`LockBackendError` if Redis does not answer."""

    def release_holder(
        self, *, task_id: str, pid: int, host: str | None = None, delay: float = 0.0
    ) -> bool:
        """Release what run ``task_id`` in process ``pid`` on ``host`` (default: this
        machine) holds of this lock, after ``delay`` seconds of delay-after, whoever made the
        handle it holds through: for a supervisor (the worker's main process) whose child
        died holding it. A claim handed over to the task's next attempt is left alone. True
        if something was released."""
        return self._release_holder(task_id, pid, host, delay)

    @property
    def _client(self) -> Connection:
        """The Connection (the Celery layer's old name for it)."""
        return self._conn

    # -- public state ------------------------------------------------------------------------

    @property
    def token(self) -> int | None:
        """The fencing token of the current (or last) acquisition: strictly increasing for
        this name across every acquisition by anyone. Pass it to storage that rejects writes
        carrying a smaller token than it has seen."""
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
    def lost(self) -> bool:
        """True once the lock is known lost: found gone or taken by a renewal, or its time
        ran out without a renewal (a paused process, Redis unreachable, max-hold passed)."""
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
            self._mark_lost(
                self._owner,
                LockExpired(
                    f"lease on {self.name!r} ran out before it was renewed"
                    " (process paused, Redis unreachable or max_hold reached)",
                    name=self.name,
                ),
            )
            assert self._lost is not None
            raise self._lost.with_traceback(None)

    # -- acquire / release / extend ----------------------------------------------------------

    def acquire(self, wait: float | None = None) -> bool:
        """Take the lock; True if taken, False if ``wait`` seconds passed first.

        ``wait`` defaults to the handle's own; ``math.inf`` waits forever. A blocked call is
        woken by a release, or when a conflicting holder's lease could have run out.
        """
        wait = self.wait if wait is None else validate.check_wait(wait)
        if self._mine() and self._lost is None:
            raise LockError(f"lock {self.name!r} is already held by this handle", name=self.name)
        owner = self._new_owner()
        sent_at = time.monotonic()
        taken, value = self._try_acquire(owner, wait > 0)
        if not taken:
            if wait <= 0:
                return False

            def attempt() -> tuple[bool, int]:
                nonlocal sent_at
                sent_at = time.monotonic()
                return self._try_acquire(owner, True)

            taken, value = self._wait_for(attempt, wait, lambda: self._abandon(owner))
            if not taken:
                return False
        self._took(owner, value, sent_at)
        return True

    def _wait_for(
        self, attempt: Callable[[], tuple[bool, int]], wait: float, abandon: Callable[[], None]
    ) -> tuple[bool, int]:
        """Retry ``attempt`` on each release published on the channel (or at its hint) until
        it succeeds or ``wait`` seconds pass; ``abandon`` runs when giving up."""
        deadline = time.monotonic() + wait
        done = False
        try:
            with self._listening() as woken:
                while True:
                    taken, value = attempt()
                    if taken:
                        done = True
                        return True, value
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False, value
                    woken.wait(min(hint_seconds(value), remaining))
                    woken.clear()
        finally:
            if not done:
                try:
                    abandon()
                except LockBackendError:
                    log.warning("could not withdraw the wait of %r", self.name, exc_info=True)

    def _listening(self) -> AbstractContextManager[threading.Event]:
        """Subscribed to what wakes this handle's waiters; yields the Event they wait on."""
        return self._conn.notifier.listening(self._channel)

    def _took(self, owner: str, token: int, sent_at: float) -> None:
        with self._state:
            self._owner = owner
            self._pid = _Process.pid
            self._token = token
            self._lost = None
            self._expires_at = sent_at + min(self._ttl_ms, self._max_hold_ms or math.inf) / 1000
        if self.heartbeat:
            heartbeat().add(self)

    def release(self, delay: float = 0.0) -> None:
        """Give the lock back. With ``delay`` seconds > 0 what it covered stays locked, with
        no owner, for that long (delay-after: a job that just ran is not started again).

        Raises :class:`LockExpired` or :class:`LockTaken` if the lock was lost meanwhile;
        another owner's lock is never touched. If Redis does not answer
        (:class:`LockBackendError`) the handle still owns the lock, no longer renewed: call
        ``release`` again once Redis is back, or let the lock run out within its ttl.
        """
        delay = validate.check_delay(delay)
        owner = self._forget()
        try:
            code = self._release(owner, validate.seconds_to_ms(delay) if delay > 0 else 0)
        except LockBackendError:
            # The release may not have reached Redis: keep the owner token so it can be
            # retried. Not renewed any more, so a caller who gives up frees it within ttl.
            with self._state:
                if self._owner is None:
                    self._owner = owner
            raise
        if code == 1:
            self._lost = None
            return
        error = self._lost_error(code, "release")
        # Found lost only now (a starved heartbeat, a paused process): on_lost fires here,
        # once, as it would have from the renewal that should have found it.
        with self._state:
            first, self._lost = self._lost is None, self._lost or error
        if first:
            self._announce_lost(error)
        raise error

    def _forget(self) -> str:
        """Stop renewing and drop the owner token (the first half of every release)."""
        if not self._mine():
            raise LockNotHeld(f"lock {self.name!r} is not held", name=self.name)
        heartbeat().remove(self)
        with self._state:
            owner, self._owner = self._owner, None
        assert owner is not None
        return owner

    def extend(self, ttl: float | None = None) -> float:
        """Set the lock's remaining time to ``ttl`` seconds (default: its ttl) and renew it
        to that length from now on. Sets, never adds. Returns the seconds granted: less than
        asked when ``max_hold`` is near, 0.0 once it has passed.

        On a handle already found lost it raises that :class:`LockLost` again, with no
        round trip: a lost lock is never renewed again, even if its key is still there."""
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
        sent_at = time.monotonic()
        calls, decode = renew_calls(self._conn, [(self, owner, ttl_ms)])
        (code,) = decode(self._conn.call(run_batch, self._conn.redis, calls))
        if code == MAX_HOLD_REACHED:
            return max(0.0, self._expires_at - time.monotonic())
        if code <= 0:
            error = self._lost_error(code, "extend")
            self._mark_lost(owner, error)
            raise error
        with self._state:
            if self._lost is not None:  # found lost by the heartbeat meanwhile: stays lost
                raise self._lost.with_traceback(None)
            self._expires_at = sent_at + code / 1000
        self.ttl, self._ttl_ms = ttl, ttl_ms
        if self.heartbeat:
            heartbeat().add(self)  # the tick period may have changed
        return code / 1000

    # -- context manager ---------------------------------------------------------------------

    def __enter__(self: H) -> H:
        if not self.acquire():
            raise LockTimeout(
                f"lock {self.name!r} not acquired within {self.wait} s", name=self.name
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except (LockLost, LockBackendError):
            if exc_type is None:
                raise
            log.warning("release of %r failed while handling %r", self.name, exc, exc_info=True)

    def __repr__(self) -> str:
        state = "lost" if self.lost else "held" if self.held else "free"
        return f"<{type(self).__name__} {self.name!r} {state} token={self._token}>"

    # -- heartbeat callbacks -----------------------------------------------------------------

    def _renewed(self, owner: str | None, code: int, sent_at: float) -> None:
        """The heartbeat's result for this handle; ``owner`` is the owner it renewed for."""
        if code > 0:
            with self._state:
                if self._owner == owner:
                    self._expires_at = sent_at + code / 1000
        elif code == MAX_HOLD_REACHED:
            heartbeat().remove(self)
            log.info("lock %r reached max_hold; it runs out within its ttl", self.name)
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
        with self._state:
            if self._owner != owner or self._lost is not None:
                return
            self._lost = error
        self._announce_lost(error)

    def _announce_lost(self, error: LockLost) -> None:
        """Stop renewing, log, and call ``on_lost`` (the handle was just marked lost)."""
        heartbeat().remove(self)
        lost_log.warning("lock %r lost (%s): %s", self.name, error.reason, error)
        if self.on_lost is not None:
            try:
                self.on_lost(self)
            except Exception:
                log.exception("on_lost callback of %r failed", self.name)
            except BaseException:
                if not renewing():
                    raise  # the caller's own thread (check, extend): SystemExit is its to act on
                # On a renewal thread, SystemExit or KeyboardInterrupt would end the renewal of
                # every other lock of the process, silently.
                log.exception("on_lost callback of %r failed", self.name)

    # -- helpers -----------------------------------------------------------------------------

    def _mine(self) -> bool:
        return self._owner is not None and self._pid == _Process.pid

    def _lost_error(self, code: int, during: str) -> LockLost:
        return lost_error(self.name, code, during)

    def _describe_holder(self, *, named: bool = True) -> list[Any]:
        """Field, value pairs the scripts store about the holder (read by the admin tools);
        without ``name`` when ``named`` is false (the script adds it per key). Cached per
        process and thread, as they were when the thread first acquired through this handle
        (a thread renamed later keeps its old name here): this is on every acquire's path."""
        pid, ident = _Process.pid, threading.get_ident()
        cached = self._holder_cache.get((named, pid, ident))
        if cached is not None:
            return cached
        thread = threading.current_thread().name
        fields = holder_fields(self, pid=pid, thread=thread, named=named)
        if len(self._holder_cache) > 64:  # short-lived threads: idents are reused, keep it small
            self._holder_cache.clear()
        self._holder_cache[(named, pid, ident)] = fields
        return fields


def holder_fields(handle: Any, *, pid: int, thread: str, named: bool = True) -> list[Any]:
    """Field, value pairs the scripts store about the holder of ``handle`` (its ``name``,
    ``kind``, ``heartbeat`` and ``owner_info``), running in ``pid`` on ``thread``; without
    ``name`` when ``named`` is false. Shared by the sync and the asyncio handles."""
    fields: list[Any] = [b"name", encode_name(handle.name)] if named else []
    fields += [
        b"kind", handle.kind,
        b"host", HOSTNAME,
        b"pid", pid,
        b"thread", thread,
        # Whether a renewal age means anything to the admin listing.
        b"heartbeat", 1 if handle.heartbeat else 0,
    ]  # fmt: skip
    return fields + info_fields(handle.owner_info)


def info_fields(owner_info: dict[str, str]) -> list[Any]:
    """Field, value pairs that store ``owner_info`` on a holder record: the keys the admin
    view reads as fields of their own (``OWN_INFO_FIELDS``), the rest as one JSON ``info``
    field, so no key of it can overwrite a field the scripts rely on (``owner``, ``token``)."""
    fields: list[Any] = []
    extra = dict(owner_info)
    for key in OWN_INFO_FIELDS:
        if key in extra:
            fields += (key, extra.pop(key))
    if extra:
        fields += (b"info", json.dumps(extra, sort_keys=True))
    return fields


def lost_error(name: str, code: int, during: str) -> LockLost:
    """The :class:`LockLost` for a release/renew reply ``code`` (GONE or TAKEN)."""
    if code == TAKEN:
        return LockTaken(f"{during}: lock {name!r} is held by another owner", name=name)
    assert code == GONE, code
    return LockExpired(f"{during}: lease on {name!r} expired and nobody holds it", name=name)


def hint_seconds(hint_ms: int) -> float:
    """How long a waiter may sleep before a conflicting lease could have run out."""
    if hint_ms < 0:
        return NO_EXPIRY_RECHECK
    return (hint_ms + 1) / 1000
