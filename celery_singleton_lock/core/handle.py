"""The thread-based lock handle: the sync runner of :class:`.handle_ops.HandleOps` (see there
for how a lock kind is built). It runs the steps with threads (script calls through
:meth:`.connection.Connection.call`, with the replicas' WAIT where the client has one), the
waits and the heartbeat.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import Any, TypeVar

from ..exceptions import LockBackendError, LockLost
from .connection import Connection, HasConnection, connection_of
from .handle_ops import HandleOps
from .handle_ops import HolderRecord as HolderRecord
from .handle_state import Options, _Process
from .heartbeat import heartbeat, renewing
from .holder import holder_fields
from .options import LockOptions, ProcessOptions, options_after_two, options_only
from .scripts import ScriptCall
from .steps import Steps, along

log = logging.getLogger("celery_singleton_lock.lease")

T = TypeVar("T")


H = TypeVar("H", bound="LockHandle")


class LockHandle(HandleOps):
    """Base of every expiring lock handle (lease, read/upgradable/write, range, multi).

    Not made directly: :class:`LockClient` has a factory per kind. ``acquire`` takes the lock,
    ``release`` gives it back, and while it is held the process's heartbeat renews it every
    ``ttl / TICKS_PER_TTL`` s, so a holder that dies frees it within ``ttl``. Used as a context
    manager it acquires (waiting up to ``wait`` seconds, else raising :class:`LockTimeout`)
    and releases on exit.

    The state and its decisions are :class:`HandleState`'s, the operations
    :class:`HandleOps`'; this class runs their steps and the waits (threads). ``on_lost`` is
    called with the handle from a heartbeat thread, or from the thread whose check() or
    extend() found the lock lost.
    """

    __slots__ = ("_conn", "_state_lock", "_holder_cache")

    _conn: Connection

    @options_after_two(LockOptions[Any])
    def __init__(
        self, client: Connection | HasConnection, name: str, options: LockOptions[Any]
    ) -> None:
        self._setup(client, name, options)

    def _setup(self, client: Any, name: Any, options: LockOptions[Any]) -> None:
        self._init_checked(options.check(name), connection_of(client))

    def _init_checked(self, options: Options, conn: Connection) -> None:
        """Set a new handle's options, checked already, and its empty state: ``__init__``,
        or a kind's constructor for options checked once for many handles."""
        self._configure(options)
        self._conn = conn
        self._state_lock = threading.Lock()
        # (named, pid, thread ident) -> the holder fields of _describe_holder.
        self._holder_cache: dict[tuple[bool, int, int], list[Any]] = {}

    # -- who holds it -----------------------------------------------------------------------

    def holders(self) -> list[HolderRecord]:
        """Who holds what this handle locks now (every name of a multi-key lock, every hold
        of a reader-writer or range lock, a release delay), in no set order; empty when it is
        free. A read of a round trip or two, for the conflict path (who is in the way).
        Raises :class:`LockBackendError` if Redis does not answer."""
        return self._run(self._holders())

    @options_only(ProcessOptions)
    def release_holder(self, process: ProcessOptions) -> bool:
        """Release what run ``task_id`` in process ``pid`` on ``host`` (default: this
        machine) holds of this lock, after a release delay of ``delay`` seconds, whoever made the
        handle it holds through: for a supervisor (the worker's main process) whose child
        died holding it. A claim handed over to the task's next attempt is left alone. True
        if something was released."""
        return self._run(self._release_holder(process))

    # -- the runner --------------------------------------------------------------------------

    def _run(self, steps: Steps[T]) -> T:
        """Run an operation's steps on this thread (:meth:`.connection.Connection.run`)."""
        return self._conn.run(steps)

    # -- acquire / release / extend ----------------------------------------------------------

    def acquire(self, wait: float | None = None) -> bool:
        """Take the lock; True if taken, False if ``wait`` seconds passed first.

        ``wait`` defaults to the handle's own; ``math.inf`` waits forever. A blocked call is
        woken by a release, or when a conflicting holder's lease could have run out.

        If Redis does not answer (:class:`LockBackendError`) or the call is interrupted,
        what its attempts may have taken or reserved is given back before it raises.
        """
        return self._run(self._acquire_steps(wait))

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
        self._run(self._release_steps(delay))

    def acquire_along(
        self, call: ScriptCall, replies: list[Any], wait: float | None = None
    ) -> bool:
        """``acquire(wait)``, with ``call`` (another script on a key in this lock's slot)
        run after each attempt, in the attempt's own script call (:func:`.steps.along`);
        ``call``'s replies, one per attempt that reached Redis, are appended to ``replies``."""
        return self._run(along(self._acquire_steps(wait), call, replies))

    def release_along(self, call: ScriptCall, replies: list[Any], delay: float = 0.0) -> None:
        """``release(delay)``, with ``call`` (as for :meth:`acquire_along`) run before it in
        its script call; ``call``'s reply is appended to ``replies`` (nothing if no round trip
        was needed, or none answered). Raises as ``release`` does."""
        self._run(along(self._release_steps(delay), call, replies, first=True))

    def extend(self, ttl: float | None = None) -> float:
        """Set the lock's remaining time to ``ttl`` seconds (default: its ttl) and renew it
        to that length from now on. Sets, never adds. Returns the seconds granted: less than
        asked when ``max_hold`` is near, 0.0 once it has passed.

        On a handle already found lost it raises that :class:`LockLost` again, with no
        round trip: a lost lock is never renewed again, even if its key is still there."""
        return self._run(self._extend_steps(ttl))

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
