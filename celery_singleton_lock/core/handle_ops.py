"""The operations of a lock handle, written once as generators of :mod:`.steps`.

:class:`HandleOps` adds to :class:`.handle_state.HandleState` (the state and its decisions)
the operations every kind shares: acquire (a first try, the wait for a release with its
outage ride-out, the undo of its attempts when it fails), release, extend. They yield the
script calls, subscriptions and pauses they need and receive the results; the sync handle
(:class:`.handle.LockHandle`) and the asyncio one (``aio.handle.AsyncLockHandle``) each run
them with their own I/O. A lock kind is one subclass of it, its own round trips written
as generators too (``_try_acquire``, ``_release``, ...), plus a thin public class per
runner (``class Lease(LeaseOps, LockHandle)``).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..exceptions import LockBackendError, LockError, LockNotReplicated
from .handle_state import HandleState, Outage, retry_in
from .heartbeat import RenewEntry, RenewUnit, renew_calls
from .scripts import ScriptCall
from .steps import Batch, Listen, Pause, Steps

if TYPE_CHECKING:
    from .options import LockOptions, ProcessOptions

HO = TypeVar("HO", bound="HandleOps")


@dataclass(frozen=True)
class HolderRecord:
    """One holder of what a handle locks, as Redis has it (see ``holders()``)."""

    #: The holder's owner token (None: a release delay, which no one owns).
    owner: str | None
    #: The ``task_id`` of its holder record, if it has one.
    task_id: str | None
    #: Server time (ms) at which a release delay ends; None when this is not a release delay.
    release_delay_until_ms: int | None = None
    #: A writer waiting for its turn: it holds nothing yet but keeps new readers out.
    waiting: bool = False
    #: The ``send`` of its holder record (the task layer's message identity), if it has one.
    send: str | None = None


def released_unreplicated(
    name: str,
    error: LockNotReplicated,
    done: str,
    risk: str = "could bring the old hold back until its ttl runs out",
) -> LockNotReplicated:
    """The error for a release or hand-over of lock ``name`` that ran on the master but that
    the replicas did not acknowledge (``error``): what the caller should know."""
    return LockNotReplicated(
        f"lock {name!r} was {done} on the master, but {error}: a failover to a replica "
        f"that missed it {risk}",
        name=name,
        replies=error.replies,
        acknowledged=error.acknowledged,
    )


def may_have_run(error: BaseException) -> bool:
    """Whether a step that ended with ``error`` may still have run on the server: a refusal
    the script answered (a LockError, but not LockBackendError) did nothing; anything else
    (a timeout, a dropped connection, a cancellation) may have come after the script ran,
    its reply lost."""
    return not isinstance(error, LockError) or isinstance(error, LockBackendError)


def changed_unreplicated(name: str, error: LockNotReplicated, done: str) -> LockNotReplicated:
    """The error for a change of a hold of lock ``name`` (an upgrade, a downgrade, a shrink:
    ``done`` says which) that ran on the master but that the replicas did not acknowledge
    (``error``): the handle's state follows the master, and the caller should know."""
    return released_unreplicated(name, error, done, "would find the hold as it was before")


def with_reply(error: LockNotReplicated, reply: Any) -> LockNotReplicated:
    """``error`` with ``reply`` as its script reply: for a kind whose script answers in codes
    of its own, read as the codes its caller expects."""
    return LockNotReplicated(
        str(error), name=error.name, replies=[reply], acknowledged=error.acknowledged
    )


def on_master_only(steps: Steps[Any]) -> Steps[None]:
    """Run ``steps``, a round trip that gives back what a failed acquire or a wait took or
    reserved: one the replicas did not acknowledge (:class:`LockNotReplicated`) still ran
    on the master, which is what giving back needs (a replica that has the hold loses it
    within its ttl: nothing renews it)."""
    with suppress(LockNotReplicated):
        yield from steps


def on_master(call: ScriptCall) -> Steps[int]:
    """Run ``call``; its reply as the master gave it, acknowledged by the replicas or not
    (:class:`LockNotReplicated`, raised only where writes wait for replicas)."""
    try:
        return int((yield call))
    except LockNotReplicated as exc:
        return int(exc.replies[0])


def nothing() -> Steps[None]:
    """An operation with no round trip."""
    return
    yield  # a generator all the same


class HandleOps(HandleState, ABC):
    """The shared operations of a handle (see the module docstring). A kind provides the
    generators ``_try_acquire(owner, reserve)``, ``_release(owner, delay_ms)``,
    ``_holders()`` and ``_release_holder(process)`` (and
    ``_abandon(owner)`` if a waiter reserves something), the classmethod
    ``_renew_script_call(conn, entries)`` the heartbeats batch, and ``_channels``."""

    __slots__ = ()

    #: The connection the runner works through (sync or asyncio); ``scripts``, ``prefix``
    #: and ``redis`` are what the operations read of it.
    _conn: Any
    #: The pub/sub channels releases of this lock are published on.
    _channels: tuple[bytes, ...]

    # -- making one --------------------------------------------------------------------------

    @abstractmethod
    def _setup(self, client: Any, name: Any, options: LockOptions[Any]) -> None:
        """Set a new handle's connection (of ``client``), and its options, checked here
        with ``name`` (ConfigurationError naming the first bad one), and its empty state:
        what the constructor does with the options its keywords make."""

    @classmethod
    def made(cls: type[HO], client: Any, name: Any, options: LockOptions[Any]) -> HO:
        """A handle of this class made from ``options`` (a client's factory has them made
        already from its keywords), as the constructor makes it."""
        handle = cls.__new__(cls)
        handle._setup(client, name, options)
        return handle

    # -- what a kind provides ----------------------------------------------------------------

    @abstractmethod
    def _try_acquire(self, owner: str, reserve: bool) -> Steps[tuple[bool, int]]:
        """One acquire round trip: (True, token) or (False, ms a waiter may sleep).
        ``reserve``: the caller will wait, so a writer may queue a reservation."""

    def _abandon(self, owner: str) -> Steps[None]:
        """The caller stopped waiting: drop whatever ``_try_acquire`` reserved."""
        return nothing()

    @abstractmethod
    def _release(self, owner: str, delay_ms: int) -> Steps[int]:
        """One release round trip: a ``Reply`` (DONE, GONE or TAKEN)."""

    @abstractmethod
    def _holders(self) -> Steps[list[HolderRecord]]:
        """Who holds what this handle locks now (``holders``)."""

    @abstractmethod
    def _release_holder(self, process: ProcessOptions) -> Steps[bool]:
        """Release what the run ``process`` names holds of this lock (not through this
        handle: for a supervisor whose child died holding it); True if released
        (``release_holder``)."""

    @classmethod
    @abstractmethod
    def _renew_script_call(cls, conn: Any, entries: list[RenewEntry]) -> ScriptCall:
        """One script call renewing ``entries``; its reply has one code per entry."""

    def _renew_units(self, owner: str, ttl_ms: int, gen: int) -> list[RenewUnit]:
        """On a Redis Cluster, this handle's renewal in units of one slot each: by default
        the whole handle, renewed by its class in the slot of its channel (every key of a
        one-name kind shares that slot)."""
        return [(type(self)._renew_script_call, self._channels[0], (self, owner, ttl_ms, gen))]

    # -- acquire -----------------------------------------------------------------------------

    def _acquire_steps(self, wait: float | None) -> Steps[bool]:
        """``acquire``: True if taken, False if ``wait`` seconds passed first. If an
        attempt fails after its send or the call is interrupted, what its attempts may have
        taken or reserved is given back before the error goes on."""
        wait, owner = self._begin_acquire(wait)
        sent_at = time.monotonic()
        try:
            taken, value = yield from self._try_acquire(owner, wait > 0)
            if not taken:
                # A hold of this very call is not waited for: it is no other caller's.
                if wait <= 0 or self._held_by_call:
                    return False

                def attempt() -> Steps[tuple[bool, int]]:
                    nonlocal sent_at
                    sent_at = time.monotonic()
                    return self._try_acquire(owner, True)

                taken, value = yield from self._wait_for(
                    attempt, wait, lambda: self._abandon(owner)
                )
                if not taken:
                    return False
        except GeneratorExit:
            raise
        except BaseException as exc:
            if may_have_run(exc):
                yield from self._undo_attempts(owner, exc)
            raise
        self._took(owner, value, sent_at)
        return True

    def _undo_attempts(self, owner: str, raising: BaseException) -> Steps[None]:
        """An attempt of this acquire call failed after its send (a timeout, a dropped
        connection: the script may have run with its reply lost) or the call was
        interrupted (cancelled); ``raising`` is the error the call goes on to raise. Give
        back whatever ``owner`` holds or reserved, so that a caller who got an error holds
        nothing, rather than the lock staying taken, unrenewed, until its ttl runs out.
        The owner token is unique to this call, so whatever it holds, this call took (a
        lease with a fixed owner token narrows this down)."""
        try:
            yield from on_master_only(self._abandon(owner))
            yield from on_master_only(self._release(owner, 0))
        except LockBackendError:
            self._withdraw_failed(raising)

    def _wait_for(
        self,
        attempt: Callable[[], Steps[tuple[bool, int]]],
        wait: float,
        abandon: Callable[[], Steps[None]],
    ) -> Steps[tuple[bool, int]]:
        """Retry ``attempt`` on each release published on the channels (or at its hint)
        until it succeeds or ``wait`` seconds pass; ``abandon`` runs when giving up."""
        deadline = time.monotonic() + wait
        done = False
        raising: BaseException | None = None  # what the wait ends with, if not an answer
        outage = Outage(deadline)
        yield Listen(self._channels)
        try:
            while True:
                try:
                    taken, value = yield from attempt()
                except LockBackendError as error:
                    yield Pause(outage.pause(error))  # see Outage
                    continue
                outage.answered()
                if taken:
                    done = True
                    return True, value
                if self._held_by_call:  # a hold of this very call: see _acquire_steps
                    return False, value
                sleep = retry_in(deadline, value)
                if sleep is None:
                    return False, value
                yield Pause(sleep)
        except BaseException as exc:
            raising = exc
            raise
        finally:
            if not done:
                try:
                    yield from on_master_only(abandon())
                except LockBackendError:
                    self._withdraw_failed(raising)

    # -- release / extend --------------------------------------------------------------------

    def _release_steps(self, delay: float) -> Steps[None]:
        """``release``: a release the replicas did not acknowledge still released (the
        handle holds nothing) and says so; one that failed otherwise keeps the owner token
        for a retry (see ``_release_unsent``)."""
        owner, delay_ms = self._begin_release(delay)
        try:
            code = yield from self._release(owner, delay_ms)
        except LockNotReplicated as exc:
            self._released(int(exc.replies[0]))
            raise released_unreplicated(self.name, exc, "released") from exc
        except BaseException:
            # Also when the call was interrupted while the release was under way.
            self._release_unsent(owner)
            raise
        self._released(code)

    def _extend_steps(self, ttl: float | None) -> Steps[float]:
        """``extend``: the seconds granted."""
        owner, _, ttl_ms, gen = self._begin_extend(ttl)
        sent_at = time.monotonic()
        calls, decode = renew_calls(self._conn, [(self, owner, ttl_ms, gen)])
        (code,) = decode((yield Batch(calls)))
        return self._extended(owner, code, sent_at, gen)
