"""The exclusive lease: one holder per name at a time, renewed by the heartbeat."""

from __future__ import annotations

import enum
import math
import os
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ..core import validate
from ..core.connection import Connection, ConnectionBase, HasConnection, connection_of
from ..core.handle import HolderRecord, LockHandle, log
from ..core.handle_ops import HandleOps, on_master, released_unreplicated
from ..core.handle_state import (
    Options,
    Outage,
    Timing,
    _Process,
    hint_seconds,
)
from ..core.heartbeat import RenewEntry, RenewUnit
from ..core.holder import holder_fields, info_fields
from ..core.keys import LockKeys, encode_name, lock_keys
from ..core.options import (
    FairOptions,
    LeaseOptions,
    LockOptions,
    ProcessOptions,
    options_after,
    options_after_two,
)
from ..core.redis_urls import is_cluster
from ..core.replies import Reply, acquire_outcome
from ..core.scripts import (
    ScriptCall,
    Scripts,
    array_header,
    fair_keys,
    pack_items,
    run,
)
from ..core.steps import Blpop, Pause, Steps
from ..core.validate import HolderProcess
from ..exceptions import LockBackendError, LockError, LockNotReplicated
from .lease_listing import lease_holders_read

#: A fair waiter's registration lasts this long unless refreshed: a waiter that died is
#: skipped by releases (not handed the lease) at most this long after it died.
FAIR_REGISTRATION_MS = 1000
#: A fair waiter refreshes its registration (and tries the name, in case it was freed
#: without a hand-off: expiry, release delay, a clear) this often.
FAIR_REFRESH = 0.25

#: Every claim's owner token starts with this: a lease held for a queued message or handed
#: over to a retry (celery/claims.py), not by a process, which :func:`release_holder` never
#: frees (lua/release.lua has the same literal: a script cannot import it).
CLAIM_OWNER_PREFIX = "claim:"


def block_for(hint: float, remaining: float) -> float:
    """Seconds a fair waiter's next ``BLPOP`` blocks: until its next refresh, the holder's
    possible expiry or the end of its wait, in whole ms and at least one (BLPOP rounds
    down, and 0 would block forever)."""
    return max(1, math.ceil(min(FAIR_REFRESH, hint, remaining) * 1000)) / 1000


def handed_token(reply: Any) -> int:
    """What a fair waiter's ``BLPOP`` returned: a fencing token when a release handed it the
    lease; 0 when it timed out, or was woken to try because the name was freed without a
    hand-off (a clear, a supervisor's or a multi-key lock's release)."""
    return 0 if reply is None else int(reply[1])


#: The slots of a lease's own state, in each runner's class (a slot may be laid out by
#: one base class only, and the runners' bases have theirs).
LEASE_SLOTS = (
    "fair", "keys", "_channels", "_queued", "_queued_hint", "_fixed_owner", "_takeover",
    "_attempt", "_free_first", "freed_first",
)  # fmt: skip


class LeaseOps(HandleOps):
    """The exclusive lease's operations, for the sync :class:`Lease` and the asyncio
    ``AsyncLease``: the same keys and scripts, so each excludes the other and SingletonTask
    runs of the same name."""

    if not TYPE_CHECKING:
        # No instance layout of its own: each runner's class lays out LEASE_SLOTS beside
        # its base's slots (mypy would read an empty tuple as "no attributes").
        __slots__ = ()

    kind = "lease"
    fair: bool
    keys: LockKeys
    _queued: str
    _queued_hint: int
    _fixed_owner: str | None
    _takeover: str
    _attempt: str
    _free_first: tuple[bytes, str, bool] | None
    freed_first: int | None

    def _setup(self, client: Any, name: Any, options: LockOptions[Any]) -> None:
        super()._setup(client, name, options)  # type: ignore[safe-super]  # the runner's
        assert isinstance(options, FairOptions), options
        self._init_lease(*options.lease_extras())

    def _init_lease(self, fair: bool, owner: str | None, take_over: str | None) -> None:
        """Set a new lease's own options, checked already, and its empty state."""
        #: A blocked acquire queues, and a release hands the lease straight to the oldest
        #: live waiter: first come, first served, and no second round trip to take it.
        self.fair = fair
        self._queued = ""  # the owner token a fair acquire waits in the queue with
        self._queued_hint = 0  # ms its last attempt said the holder's lease may still run
        #: The Redis keys of this lease (lock hash, fencing counter, channel).
        self.keys = lock_keys(self._conn.prefix, self.name)
        self._channels = (self.keys.channel,)
        # Claims (celery/claims.py): hold the name as this fixed owner token instead of a
        # fresh one, and/or take over a claim held under that token.
        self._fixed_owner = owner
        self._takeover = take_over or ""
        # The id of the current acquire call when its owner token is fixed ('' otherwise):
        # what tells what this call took from what that owner held already.
        self._attempt = ""
        self._free_first = None
        #: What the last acquire's :meth:`free_first` release did (a :class:`Reply`:
        #: DONE, GONE or TAKEN); None if it had none.
        self.freed_first = None

    def _packed_holder(self) -> bytes:
        return packed_lease_holder(self.name, self.heartbeat, self.owner_info)

    def _new_owner(self) -> str:
        owner = self._fixed_owner or super()._new_owner()
        self._queued = owner
        self._attempt = os.urandom(8).hex() if self._fixed_owner else ""
        return owner

    def _undo_attempts(self, owner: str, raising: BaseException) -> Steps[None]:
        """Undo what this acquire call took, and only that (see the base class).

        The rule, for each way the name can be held by ``owner`` after the failed call:

        - taken fresh by this call: released (its waiters woken, as by a release);
        - taken over from the claim ``take_over`` by this call: that claim is put back as it
          was (owner token, holder record, expiry; acquire.lua kept it aside), so a failed
          take-over never frees the queued message's claim;
        - held under a fixed ``owner`` token since before this call (a claim that token
          holds already, which a re-sent attempt finds and answers as taken): left alone.

        The last two need to know which call took the name: a random owner token is the
        call's own, and a fixed one is stored with the call's id (acquire.lua's ``attempt``).
        A claim this call freed first (:meth:`free_first`) stays freed: that release stands
        whatever the acquire does.

        On a replicated client the undo ran on the master even when its replicas did not
        acknowledge it (an acquire that was not replicated is undone while they lag): the
        undo goes on from the script's reply."""
        scripts = self._conn.scripts
        try:
            if self.fair:
                yield from self._leave_queue(owner, raising)
            undone = yield from on_master(
                scripts.acquire_undo_call(self.keys.lock, owner, self._attempt)
            )
            if undone == Reply.HELD:
                yield from on_master(scripts.release_call(self.keys.lock, owner, 0))
        except LockBackendError:
            self._withdraw_failed(raising)

    def _try_acquire(self, owner: str, reserve: bool) -> Steps[tuple[bool, int]]:
        scripts = self._conn.scripts
        free, self._free_first = self._free_first, None
        if free is not None and (reserve or self.fair):
            # acquire.lua's mode argument says reserve or fair: release in a call of its own.
            free_key, free_owner, stop = free
            self.freed_first = int((yield scripts.release_call(free_key, free_owner, 0)))
            if stop and self.freed_first == Reply.TAKEN:
                return False, 0
            free = None
        keys = self.keys
        # With ``free`` (a single try, neither waiting nor fair) its mode is the script's.
        reply = yield scripts.acquire_call(
            keys.lock, keys.fence, owner, self._ttl_ms, self._max_hold_ms,
            self._packed_holder(), self._takeover, waiting=reserve,
            fair_ms=FAIR_REGISTRATION_MS if reserve and self.fair else 0, attempt=self._attempt,
            free=free,
        )  # fmt: skip
        code, value = acquire_outcome(reply)
        taken = code == Reply.DONE
        if free is not None:
            self.freed_first = int(reply[2])
        else:
            self._queued_hint = value  # a fair wait's first block ends no later than this
        return taken, value

    def _wait_for(
        self,
        attempt: Callable[[], Steps[tuple[bool, int]]],
        wait: float,
        abandon: Callable[[], Steps[None]],
    ) -> Steps[tuple[bool, int]]:
        if not self.fair:
            return super()._wait_for(attempt, wait, abandon)
        return self._wait_in_queue(attempt, wait)

    def _wait_in_queue(
        self, attempt: Callable[[], Steps[tuple[bool, int]]], wait: float
    ) -> Steps[tuple[bool, int]]:
        """Block on this waiter's hand-off list, on a pooled connection of its own, until a
        release hands it the lease; refresh the registration (and try the name, in case it
        was freed without a hand-off) between blocks. A wait that runs out leaves the queue,
        and keeps a lease handed over meanwhile."""
        owner = self._queued
        handed = fair_keys(self.keys.base, owner)[2]
        deadline = time.monotonic() + wait
        hint = hint_seconds(self._queued_hint)
        outage = Outage(deadline)
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    token = handed_token((yield Blpop(handed, block_for(hint, remaining))))
                    if token:
                        return True, token
                    taken, value = yield from attempt()
                except LockBackendError as error:
                    # See Outage; the next attempt queues again, as the same owner.
                    yield Pause(outage.pause(error))
                    continue
                outage.answered()
                if taken:
                    return True, value
                hint = hint_seconds(value)
        except LockBackendError as error:
            if (yield from self._leave_queue(owner, error)):
                # A release handed the lease over, and the reply that said so was lost:
                # nothing would renew it, and the caller gets an error, not the lease.
                yield from self._give_back(owner)
            raise
        # Not _leave_queue: a withdrawal Redis did not answer may have run just after a
        # release handed this waiter the lease, its reply lost. Raised, so that the acquire
        # gives back whatever its owner holds (_undo_attempts) rather than answering False
        # with the name held, unrenewed, until its ttl runs out.
        token = yield from self._withdraw_from_queue(owner)
        return (True, token) if token else (False, 0)

    def _withdraw_from_queue(self, owner: str) -> Steps[int]:
        """Withdraw from the queue; the token if a release handed the lease over meanwhile
        (this waiter then holds it, taken as its wait ran out). Raises LockBackendError if
        Redis does not answer."""
        # Withdrawn on the master whether or not its replicas acknowledged it: a token in the
        # reply is a lease this waiter now holds there.
        return (yield from on_master(self._conn.scripts.fair_abandon_call(self.keys.lock, owner)))

    def _leave_queue(self, owner: str, raising: BaseException) -> Steps[int]:
        """:meth:`_withdraw_from_queue`, or 0 if Redis does not answer (logged): for the
        clean-up of a wait that failed with ``raising``, which gives back what the owner
        holds after it."""
        try:
            return (yield from self._withdraw_from_queue(owner))
        except LockBackendError:
            self._withdraw_failed(raising)
            return 0

    def _give_back(self, owner: str) -> Steps[None]:
        try:
            yield self._conn.scripts.release_call(self.keys.lock, owner, 0)
        except LockBackendError:  # it runs out within its ttl
            log.warning("could not give back the lease of %r", self.name, exc_info=True)

    def _release(self, owner: str, delay_ms: int) -> Steps[int]:
        call = self._conn.scripts.release_call(self.keys.lock, owner, delay_ms, self._token)
        return int((yield call))

    @classmethod
    def _renew_script_call(cls, conn: Any, entries: list[RenewEntry]) -> ScriptCall:
        scripts: Scripts = conn.scripts
        return scripts.renew_call(
            [(lease.keys.lock, owner, ttl_ms, gen) for lease, owner, ttl_ms, gen in entries]
        )

    def _renew_units(self, owner: str, ttl_ms: int, gen: int) -> list[RenewUnit]:
        return [(renew_lease_keys, self.keys.lock, (self.keys.lock, owner, ttl_ms, gen))]

    def _holders(self) -> Steps[list[HolderRecord]]:
        return lease_holders_read([self.keys.lock])

    def _release_holder(self, process: ProcessOptions) -> Steps[bool]:
        return holder_released(self._conn, self.name, process)

    def _hand_over(self, new_owner: str, ttl: float, flat: list[Any]) -> Steps[None]:
        """Pass the held name to ``new_owner`` (a claim) with the holder ``flat`` field, value
        pairs, without freeing it in between; this handle no longer holds it afterwards.
        Raises LockLost if it was lost already."""
        owner = self._forget()
        call = self._conn.scripts.handover_call(
            self.keys.lock, owner, new_owner, validate.seconds_to_ms(ttl), flat
        )
        try:
            code = int((yield call))
        except LockNotReplicated as exc:
            if int(exc.replies[0]) != Reply.DONE:
                raise self._lost_error(int(exc.replies[0]), "hand over") from exc
            raise released_unreplicated(self.name, exc, "handed over") from exc
        if code != Reply.DONE:
            raise self._lost_error(code, "hand over")


class Lease(LeaseOps, LockHandle):
    """An exclusive, expiring lock on one name.

    Made by :meth:`LockClient.lease`. ``acquire`` takes it, ``release`` gives it back, and
    while it is held the process's heartbeat renews it every ``ttl / TICKS_PER_TTL`` s, so a holder
    that dies frees the name within ``ttl``. Used as a context manager it acquires (waiting up
    to ``wait`` seconds, else raising :class:`LockTimeout`) and releases on exit.
    """

    __slots__ = LEASE_SLOTS

    @options_after_two(LeaseOptions["Lease"])
    def __init__(
        self, client: Connection | HasConnection, name: str, options: LeaseOptions[Lease]
    ) -> None:
        """Options as for :meth:`LockClient.lease`."""
        self._setup(client, name, options)

    @classmethod
    def _from_checked(cls, conn: Connection, options: Options) -> Lease:
        """A lease (not fair, no fixed owner) from ``options`` checked already (see
        :class:`LeaseMaker`)."""
        lease = cls.__new__(cls)
        lease._init_checked(options, conn)
        lease._init_lease(False, None, None)
        return lease

    @property
    def take_over(self) -> str | None:
        """The owner token whose hold an acquire takes over, as if the name were free (a
        claim made for this run by :meth:`hand_over` or at enqueue), or None. Settable
        while the lease is not held."""
        return self._takeover or None

    @take_over.setter
    def take_over(self, owner: str | None) -> None:
        owner = None if owner is None else validate.check_owner(owner, "take_over")
        if self._mine():
            raise LockError(f"lease on {self.name!r} is held: take_over applies to an acquire")
        self._takeover = owner or ""

    def hand_over(
        self, owner: str, *, ttl: float, owner_info: dict[str, Any] | None = None
    ) -> None:
        """Pass the held name to the owner token ``owner`` (a claim a later run takes over
        with ``take_over``) for ``ttl`` seconds, with ``owner_info`` as its holder record,
        without freeing it in between; this handle holds nothing afterwards (no heartbeat
        renews the claim). Raises :class:`LockLost` if Redis no longer has it as this
        handle's, :class:`LockNotHeld` if it is not held, :class:`LockBackendError` if Redis
        does not answer (the lease then runs out by itself); on a replicated client,
        :class:`LockNotReplicated` if it was handed over on the master but not acknowledged
        by the replicas."""
        owner = validate.check_owner(owner, "owner")
        ttl = validate.check_positive(ttl, "ttl")
        flat = info_fields(validate.check_owner_info(owner_info))
        self._run(self._hand_over(owner, ttl, flat))

    def free_first(self, name: str, owner: str, *, stop_if_taken: bool = False) -> bool:
        """Make the next acquire attempt first release lease ``name`` if the owner token
        ``owner`` holds it (a claim this run no longer needs), in the same round trip and
        whatever the acquire finds; what it did lands in :attr:`freed_first`. With
        ``stop_if_taken``, when another owner holds ``name`` the attempt stops there and
        the acquire fails. False, and nothing changed, on a Redis Cluster: the two names'
        keys live in different slots, so the caller releases ``name`` itself."""
        # Checked as release_owner checks them: an empty owner would match a release delay.
        lock_key = self._conn.keys(name).lock
        owner = validate.check_owner(owner, "owner")
        stop_if_taken = validate.check_bool(stop_if_taken, "stop_if_taken")
        if is_cluster(self._conn.redis):
            return False
        self._free_first = (lock_key, owner, stop_if_taken)
        self.freed_first = None
        return True


class LeaseMaker:
    """Leases on any name with one ``ttl`` and ``max_hold``, checked once here rather than by
    every lease: for code that makes a fresh lease per job, as the Celery layer does per task
    run. Each lease has the heartbeat on, no default wait, no fixed owner, and is not fair
    (what :meth:`LockClient.lease` makes by default)."""

    def __init__(
        self,
        client: Connection | HasConnection,
        *,
        ttl: float = 30.0,
        max_hold: float | None = None,
    ) -> None:
        self.ttl = validate.check_positive(ttl, "ttl")
        self._timing = Timing.check(self.ttl, max_hold)
        self.max_hold = self._timing.max_hold
        self._conn = connection_of(client)

    def lease(
        self,
        name: str,
        *,
        owner_info: dict[str, Any] | None = None,
        on_lost: Callable[[Lease], object] | None = None,
    ) -> Lease:
        """A lease on ``name`` (not yet acquired), as ``LockClient.lease(name, ttl=...,
        max_hold=..., owner_info=..., on_lost=...)`` makes it; bad arguments raise
        ConfigurationError the same way."""
        options = Options(
            validate.check_name(name),
            self._timing,
            True,
            0.0,
            validate.check_owner_info(owner_info),
            validate.check_callable(on_lost, "on_lost"),
        )
        return Lease._from_checked(self._conn, options)


class _ThreadFields:
    """The holder fields (``holder_fields``) of leases that depend only on the process and
    thread acquiring them and on the heartbeat option (kind, host, pid, thread name,
    heartbeat), kept per process and thread, and made again if the thread was renamed."""

    def __init__(self, heartbeat: bool) -> None:
        # What holder_fields reads of a lease, less its name and owner_info (a lease adds
        # those itself).
        self._shape = SimpleNamespace(kind=LeaseOps.kind, heartbeat=heartbeat, owner_info={})
        self._cache: dict[tuple[int, int], tuple[str, int, bytes]] = {}

    def get(self) -> tuple[int, bytes]:
        """How many items the fields are, and those items packed for acquire.lua
        (``pack_items``)."""
        pid, thread = _Process.pid, threading.current_thread()
        key = (pid, thread.ident or 0)
        found = self._cache.get(key)
        if found is not None and found[0] == thread.name:
            return found[1], found[2]
        fields = holder_fields(self._shape, pid=pid, thread=thread.name, named=False)
        if len(self._cache) > 64:  # short-lived threads: idents are reused, keep it small
            self._cache.clear()
        packed = pack_items(fields)
        self._cache[key] = (thread.name, len(fields), packed)
        return len(fields), packed


#: The per-thread holder fields of every lease, by its heartbeat option.
_THREAD_FIELDS = {True: _ThreadFields(True), False: _ThreadFields(False)}


def packed_lease_holder(name: str, heartbeat: bool, owner_info: dict[str, str]) -> bytes:
    """The holder fields of a lease on ``name`` acquired by this thread, packed as
    acquire.lua's one holder argument (``pack_holder(holder_fields(...))``, the same bytes).
    A lease is mostly made per use and acquired once, so a cache of its own would never
    hit: the fields of the process and thread are packed once per thread for every lease
    (sync or asyncio), and only the name and ``owner_info`` per acquire."""
    count, packed = _THREAD_FIELDS[heartbeat].get()
    info = info_fields(owner_info)
    return (
        array_header(2 + count + len(info))
        + pack_items((b"name", encode_name(name)))
        + packed
        + pack_items(info)
    )


class ReleaseResult(enum.IntEnum):
    """What :meth:`LockClient.release_owner` did (release.lua's reply)."""

    #: Released (or put in a release delay).
    RELEASED = 1
    #: Nothing was held under the name.
    NOT_HELD = 0
    #: Another owner holds the name; it was left alone.
    HELD_BY_ANOTHER = -1


def release_owner(
    client: Connection | HasConnection, name: str, owner: str, *, delay: float = 0.0
) -> ReleaseResult:
    """Release lease ``name`` if the owner token ``owner`` holds it (a claim: see
    :meth:`Lease.hand_over`), after a release delay of ``delay`` seconds. One round trip."""
    conn = connection_of(client)
    keys = conn.keys(name)
    owner = validate.check_owner(owner, "owner")
    delay = validate.check_delay(delay)
    delay_ms = validate.seconds_to_ms(delay) if delay > 0 else 0
    conn.check_layout()
    code = conn.call(run, conn.scripts.release_call(keys.lock, owner, delay_ms))
    return ReleaseResult(int(code))


def renew_lease_keys(conn: Connection, units: list[tuple[bytes, str, int, int]]) -> ScriptCall:
    """One renew.lua call for (lock key, owner, ttl ms, generation) units: on a Redis
    Cluster the leases and the names of multi-key locks in one slot are renewed together
    by it."""
    return conn.scripts.renew_call(units)


@options_after(ProcessOptions)
def release_holder(client: Connection | HasConnection, name: str, process: ProcessOptions) -> bool:
    """Release lease ``name`` (after a release delay of ``delay`` seconds) if task ``task_id``
    running in process ``pid`` on ``host`` (default: this machine) holds it; for a
    supervisor whose child can no longer release. A claim handed over for the task's next
    attempt is never released here. True if released."""
    conn = connection_of(client)
    return conn.run(holder_released(conn, name, process))


def holder_released(conn: ConnectionBase, name: str, process: ProcessOptions) -> Steps[bool]:
    """:func:`release_holder`'s steps, on a sync or an asyncio connection."""
    keys = conn.keys(name)
    return (yield from process_hold_released(conn, keys, process.check()))


def process_hold_released(
    conn: ConnectionBase, keys: LockKeys, process: HolderProcess
) -> Steps[bool]:
    """release.lua, as a supervisor's, on the lease of ``keys`` for ``process``: True if
    released."""
    call = conn.scripts.release_holder_call(keys.lock, *process)
    return int((yield call)) == Reply.DONE
