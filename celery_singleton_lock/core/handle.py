"""The thread-based lock handle: the driver of :class:`.handle_state.HandleState`.

A lock kind is a subclass supplying the abstract methods of :class:`LockHandle`: the round
trips ``_try_acquire(owner, reserve)``, ``_release(owner, delay_ms)``,
``_renew_script_call(conn, entries)`` and ``_release_holder(task_id, pid, host, delay)``, and
the ``_channel`` its releases are published on (and, for a kind holding keys in several
Redis Cluster slots, ``_renew_units``). When a handle is held or lost, how long a blocked
acquire sleeps, what a renewal code does, is decided once in :mod:`.handle_state` (shared
with the asyncio handle); this module runs the round trips, the waits and the heartbeat, so
every lock kind behaves like the exclusive :class:`Lease`.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from ..exceptions import LockBackendError, LockError, LockLost, LockNotReplicated
from .connection import Connection, HasConnection, connection_of
from .handle_state import (
    HandleState,
    Options,
    Outage,
    _Process,
    check_options,
    retry_in,
)
from .heartbeat import RenewEntry, RenewUnit, heartbeat, renew_calls, renewing
from .holder import holder_fields
from .notifier import Wakeup
from .scripts import ScriptCall, run_batch

log = logging.getLogger("celery_singleton_lock.lease")


def released_unreplicated(name: str, error: LockNotReplicated, done: str) -> LockNotReplicated:
    """The error for a release or hand-over of lock ``name`` that ran on the master but that
    the replicas did not acknowledge (``error``): what the caller should know."""
    return LockNotReplicated(
        f"lock {name!r} was {done} on the master, but {error}: a failover to a replica "
        "that missed it could bring the old hold back until its ttl runs out",
        name=name,
        replies=error.replies,
        acknowledged=error.acknowledged,
    )


@dataclass(frozen=True)
class HolderRecord:
    """One holder of what a handle locks, as Redis has it (see :meth:`LockHandle.holders`)."""

    #: The holder's owner token (None: a release delay, which no one owns).
    owner: str | None
    #: The ``task_id`` of its holder record, if it has one.
    task_id: str | None
    #: Server time (ms) at which a release delay ends; None when this is not a release delay.
    release_delay_until_ms: int | None = None
    #: A writer waiting for its turn: it holds nothing yet but keeps new readers out.
    waiting: bool = False


H = TypeVar("H", bound="LockHandle")


class LockHandle(HandleState, ABC):
    """Base of every expiring lock handle (lease, read/upgradable/write, range, multi).

    Not made directly: :class:`LockClient` has a factory per kind. ``acquire`` takes the lock,
    ``release`` gives it back, and while it is held the process's heartbeat renews it every
    ``ttl / TICKS_PER_TTL`` s, so a holder that dies frees it within ``ttl``. Used as a context
    manager it acquires (waiting up to ``wait`` seconds, else raising :class:`LockTimeout`)
    and releases on exit.

    The state and its decisions are :class:`HandleState`'s; this class runs the round trips
    and the waits (threads). ``on_lost`` is called with the handle from a heartbeat thread,
    or from the thread whose check() or extend() found the lock lost.
    """

    __slots__ = ("_conn", "_state", "_holder_cache")

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
        options = check_options(name, ttl, heartbeat, max_hold, wait, owner_info, on_lost)
        self._init_checked(options, connection_of(client))

    def _init_checked(self, options: Options, conn: Connection) -> None:
        """Set a new handle's options, checked already, and its empty state: ``__init__``,
        or a kind's constructor for options checked once for many handles."""
        self._configure(options)
        self._conn = conn
        self._state = threading.Lock()
        # (named, pid, thread ident) -> the holder fields of _describe_holder.
        self._holder_cache: dict[tuple[bool, int, int], list[Any]] = {}

    # -- what a subclass provides ------------------------------------------------------------

    #: The pub/sub channel releases of this lock are published on.
    _channel: bytes

    @abstractmethod
    def _try_acquire(self, owner: str, reserve: bool) -> tuple[bool, int]:
        """One acquire round trip: (True, token) or (False, ms a waiter may sleep).
        ``reserve``: the caller will wait, so a writer may queue a reservation."""

    def _abandon(self, owner: str) -> None:  # noqa: B027 - optional: a no-op unless overridden
        """The caller stopped waiting: drop whatever ``_try_acquire`` reserved."""

    @abstractmethod
    def _release(self, owner: str, delay_ms: int) -> int:
        """One release round trip: a ``HolderReply`` (DONE, GONE or TAKEN)."""

    @classmethod
    @abstractmethod
    def _renew_script_call(cls, conn: Connection, entries: list[RenewEntry]) -> ScriptCall:
        """One script call renewing ``entries``; its reply has one code per entry."""

    def _renew_units(self, owner: str, ttl_ms: int, gen: int) -> list[RenewUnit]:
        """On a Redis Cluster, this handle's renewal in units of one slot each: by default
        the whole handle, renewed by its class in the slot of its channel (every key of a
        one-name kind shares that slot)."""
        return [(type(self)._renew_script_call, self._channel, (self, owner, ttl_ms, gen))]

    @abstractmethod
    def _release_holder(self, task_id: str, pid: int, host: str | None, delay: float) -> bool:
        """Release what run ``task_id`` in process ``pid`` on ``host`` (None: this machine)
        holds of this lock (not through this handle: for a supervisor whose child died
        holding it); True if released."""

    @abstractmethod
    def holders(self) -> list[HolderRecord]:
        """Who holds what this handle locks now (every name of a multi-key lock, every hold
        of a reader-writer or range lock, a release delay), in no set order; empty when it is
        free. A read of a round trip or two, for the conflict path (who is in the way).
        Raises :class:`LockBackendError` if Redis does not answer."""

    def release_holder(
        self, *, task_id: str, pid: int, host: str | None = None, delay: float = 0.0
    ) -> bool:
        """Release what run ``task_id`` in process ``pid`` on ``host`` (default: this
        machine) holds of this lock, after a release delay of ``delay`` seconds, whoever made the
        handle it holds through: for a supervisor (the worker's main process) whose child
        died holding it. A claim handed over to the task's next attempt is left alone. True
        if something was released."""
        return self._release_holder(task_id, pid, host, delay)

    # -- acquire / release / extend ----------------------------------------------------------

    def acquire(self, wait: float | None = None) -> bool:
        """Take the lock; True if taken, False if ``wait`` seconds passed first.

        ``wait`` defaults to the handle's own; ``math.inf`` waits forever. A blocked call is
        woken by a release, or when a conflicting holder's lease could have run out.

        If Redis does not answer (:class:`LockBackendError`) or the call is interrupted,
        what its attempts may have taken or reserved is given back before it raises.
        """
        wait, owner = self._begin_acquire(wait)
        sent_at = time.monotonic()
        try:
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
        except BaseException as exc:
            # A refusal the script answered (LockError, but not LockBackendError) took
            # nothing; anything else may have come after the script ran.
            if not isinstance(exc, LockError) or isinstance(exc, LockBackendError):
                self._undo_attempts(owner)
            raise
        self._took(owner, value, sent_at)
        return True

    def _undo_attempts(self, owner: str) -> None:
        """An attempt of this acquire call failed after its send (a timeout, a dropped
        connection: the script may have run with its reply lost) or the call was
        interrupted. Give back whatever ``owner`` holds or reserved, so that a caller who
        got an error holds nothing, rather than the lock staying taken, unrenewed, until its
        ttl runs out. The owner token is unique to this call, so whatever it holds, this
        call took (a lease with a fixed owner token narrows this down)."""
        try:
            self._abandon(owner)
            self._release(owner, 0)
        except LockBackendError:
            self._withdraw_failed()

    def _wait_for(
        self, attempt: Callable[[], tuple[bool, int]], wait: float, abandon: Callable[[], None]
    ) -> tuple[bool, int]:
        """Retry ``attempt`` on each release published on the channel (or at its hint) until
        it succeeds or ``wait`` seconds pass; ``abandon`` runs when giving up."""
        deadline = time.monotonic() + wait
        done = False
        outage = Outage(deadline)
        try:
            with self._listening() as woken:
                while True:
                    try:
                        taken, value = attempt()
                    except LockBackendError as error:
                        woken.wait(outage.pause(error))  # see Outage
                        continue
                    outage.answered()
                    if taken:
                        done = True
                        return True, value
                    sleep = retry_in(deadline, value)
                    if sleep is None:
                        return False, value
                    woken.wait(sleep)
        finally:
            if not done:
                try:
                    abandon()
                except LockBackendError:
                    self._withdraw_failed()

    def _listening(self) -> AbstractContextManager[Wakeup]:
        """Subscribed to what wakes this handle's waiters; yields what they wait on."""
        return self._conn.notifier.listening(self._channel)

    def release(self, delay: float = 0.0) -> None:
        """Give the lock back. With ``delay`` seconds > 0 what it covered stays locked, with
        no owner, for that long (release delay: a job that just ran is not started again).

        Raises :class:`LockExpired` or :class:`LockTaken` if the lock was lost meanwhile;
        another owner's lock is never touched. If Redis does not answer
        (:class:`LockBackendError`) the handle still owns the lock, no longer renewed: call
        ``release`` again once Redis is back, or let the lock run out within its ttl.
        With ``replicas`` (a replicated client), a release the replicas did not acknowledge
        raises :class:`LockNotReplicated`: it did happen on the master, the handle no longer
        holds the lock.
        """
        owner, delay_ms = self._begin_release(delay)
        try:
            code = self._release(owner, delay_ms)
        except LockNotReplicated as exc:
            self._released(int(exc.replies[0]))
            raise released_unreplicated(self.name, exc, "released") from exc
        except LockBackendError:
            self._release_unsent(owner)
            raise
        self._released(code)

    def extend(self, ttl: float | None = None) -> float:
        """Set the lock's remaining time to ``ttl`` seconds (default: its ttl) and renew it
        to that length from now on. Sets, never adds. Returns the seconds granted: less than
        asked when ``max_hold`` is near, 0.0 once it has passed.

        On a handle already found lost it raises that :class:`LockLost` again, with no
        round trip: a lost lock is never renewed again, even if its key is still there."""
        owner, _, ttl_ms, gen = self._begin_extend(ttl)
        sent_at = time.monotonic()
        calls, decode = renew_calls(self._conn, [(self, owner, ttl_ms, gen)])
        conn = self._conn
        (code,) = decode(conn.call(run_batch, conn.redis, calls, conn.replication))
        return self._extended(owner, code, sent_at, gen)

    # -- context manager ---------------------------------------------------------------------

    def __enter__(self: H) -> H:
        if not self.acquire():
            raise self._timed_out()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._mine():
            return  # the body gave it back itself (release, hand_over): nothing to release
        try:
            self.release()
        except (LockLost, LockBackendError):
            self._exit_release_failed(exc)

    # -- the hooks of HandleState ------------------------------------------------------------

    def _start_renewing(self) -> None:
        heartbeat().add(self)

    def _stop_renewing(self) -> None:
        heartbeat().remove(self)

    def _call_on_lost(self) -> None:
        assert self.on_lost is not None
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
