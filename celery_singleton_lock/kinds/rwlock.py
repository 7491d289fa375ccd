"""Three-phase reader-writer locks: read, upgradable and write.

Read is compatible with read and upgradable; upgradable with read only (one upgradable at a
time); write with nothing (database S/U/X locks). Writers are preferred: once a writer waits,
its short, renewed reservation makes new readers and upgradables wait, so a reader stream
cannot starve it, and the readers it held back all get in together when it leaves (every
waiter of the channel is woken). Each reader is its own entry with its own expiry: a crashed
reader frees its share within its lease, and there is no reader limit.

Keys (``lua/rw_common.lua`` documents them)::

    B exp         hash  the lock: w (the writer's owner), u (the upgradable's), r:<owner>
                  per reader, q (until when a waiting writer holds new readers back)
    B h:<owner>   hash  one hold (the holder record the admin lists), expiring with it
    B wq          zset  owner -> expiry of each waiting writer's reservation
    B waiting     string: a waiter sleeps on the lock; releases publish only while it is there
    B chan        pub/sub channel woken by releases, withdrawals and downgrades
    P{T}:fence    the fencing counter shared with the lease of the same name

with ``B = P{T}:rw:``. Acquire, release, upgrade and downgrade are one script call each.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..core import validate
from ..core.connection import Connection, ConnectionBase, HasConnection, connection_of
from ..core.handle import HolderRecord, LockHandle
from ..core.handle_ops import HandleOps, changed_unreplicated, may_have_run, with_reply
from ..core.heartbeat import RenewEntry
from ..core.holder import ListedHolder, text
from ..core.keys import name_tag
from ..core.options import ProcessOptions
from ..core.replication import Replication
from ..core.replies import Reply, acquire_outcome
from ..core.scripts import (
    ADVISORY,
    CLOCK,
    FENCING,
    TRACE,
    ScriptCall,
    ScriptHost,
    bound_to,
    pack_holder,
    register,
    source_after,
)
from ..core.steps import CheckLayout, Command, Steps
from ..exceptions import LockError, LockNotHeld, LockNotReplicated
from . import intervals
from .intervals import RESERVATION_MS, holder_reply, wait_hint

if TYPE_CHECKING:
    from redis.commands.core import Script

FAMILY = b"rw"
MODE_NAMES = intervals.MODE_NAMES
#: Pairs of modes whose holds share: readers beside readers and beside one upgradable.
_SHARED = frozenset((("r", "r"), ("r", "u"), ("u", "r")))


@dataclass(frozen=True)
class RWKeys:
    """The Redis names of one reader-writer lock (see the module docstring)."""

    base: bytes
    lock: bytes
    queue: bytes
    waiting: bytes
    fence: bytes
    channel: bytes

    def holder(self, owner: str) -> bytes:
        return self.base + b"h:" + owner.encode()


def rw_keys(prefix: str, name: str) -> RWKeys:
    """Keys of the reader-writer lock ``name``."""
    slot = prefix.encode() + b"{" + name_tag(name) + b"}:"
    base = slot + FAMILY + b":"
    return RWKeys(
        base=base,
        lock=base + b"exp",
        queue=base + b"wq",
        waiting=base + b"waiting",
        fence=slot + b"fence",
        channel=base + b"chan",
    )


class RWScripts:
    """The reader-writer scripts registered on one Redis client (no I/O); the acquire,
    release and change wait for ``replication``'s replicas (the heartbeat's batches add the
    renewals' WAIT)."""

    def __init__(self, redis: Any, replication: Replication | None = None) -> None:
        def load(waits: Replication | None, *names: str) -> Script:
            return register(redis, source_after(CLOCK, ADVISORY, "rw_common", *names), waits)

        self.acquire = register(
            redis, source_after(CLOCK, FENCING, ADVISORY, "rw_common", "rw_acquire"), replication
        )
        self.release = load(replication, TRACE, "rw_release")
        self.change = load(replication, "rw_change")
        self.renew = load(None, "renew_hold", "rw_renew")


def scripts(client: ScriptHost) -> RWScripts:
    """The reader-writer scripts of ``client`` (sync or asyncio), registered on first use."""
    return bound_to(client, RWScripts)


class RWLockOps(HandleOps):
    """One hold of a reader-writer lock: the operations of the sync :class:`RWLockHandle`
    and the asyncio one, with the upgrade and downgrade of an upgradable hold."""

    _family = FAMILY
    #: Every hold covers the whole line (as interval holds would say it).
    lo = -math.inf
    hi = math.inf
    mode: str
    #: The Redis keys of this lock.
    keys: RWKeys
    #: Whether the hold is upgraded to the writer; None when an upgrade or a downgrade got
    #: no answer (LockBackendError, a cancellation): it may have run, so the hold may be in
    #: either mode until the next change is answered.
    _upgraded: bool | None
    #: The last ``_describe_holder()`` list and its packed bytes (``_packed_holder``).
    _packed: tuple[list[Any], bytes] | None = None
    #: The call identity this hold is taken for (None: none); see :func:`.intervals.check_call`.
    call: str | None = None

    def _set_mode(self, prefix: str, mode: str, call: object = None) -> None:
        self.call = intervals.check_call(call)
        self.mode = mode
        self.kind = MODE_NAMES[mode]
        self._upgraded = False
        self.keys = rw_keys(prefix, self.name)
        self._channels = (self.keys.channel,)

    @property
    def upgraded(self) -> bool:
        """True while an upgradable hold is upgraded to the writer. False too after an
        upgrade or a downgrade that raised LockBackendError (or was cancelled while under
        way), until the next one is answered: it may have run, so the hold may be in
        either mode."""
        return self._upgraded is True

    # -- the round trips ---------------------------------------------------------------------

    def _try_acquire(self, owner: str, reserve: bool) -> Steps[tuple[bool, int]]:
        queued = reserve and self.mode == "w"
        keys = [self.keys.lock, self.keys.holder(owner), self.keys.fence]
        args = [
            owner, self.mode, self._ttl_ms, self._max_hold_ms,
            RESERVATION_MS if queued else 0, "1" if reserve else "", self._packed_holder(),
            self.call or "",
        ]  # fmt: skip
        reply = yield scripts(self._conn).acquire, keys, args
        code, value = acquire_outcome(reply)
        if code == Reply.DONE:
            return True, value
        if code == Reply.HELD_BY_CALL:
            return self._refused_for_call(value)
        return False, wait_hint(value, queued)

    def _abandon(self, owner: str) -> Steps[None]:
        # A waiting writer's reservation holds readers back: drop it.
        if self.mode == "w":
            yield from self._release(owner, 0)

    def _release(self, owner: str, delay_ms: int) -> Steps[int]:
        try:
            call = release_call(self._conn, self.keys, owner, delay_ms, mode=self._held_mode())
            return holder_reply(int((yield call)))
        except LockNotReplicated as exc:
            raise with_reply(exc, holder_reply(int(exc.replies[0]))) from exc

    def _held_mode(self) -> str:
        """The mode this handle holds in: an upgraded hold is the writer; 'u' (the release
        reads the mode from the hold's hash) for an upgradable hold in either mode."""
        return "w" if self._upgraded is True else self.mode

    def _change(
        self, op: str, reserve: int = 0
    ) -> Steps[tuple[int, int, LockNotReplicated | None]]:
        """One rw_change.lua round trip: its code and value, and the error to raise once the
        handle's state follows a change the replicas did not acknowledge."""
        owner = self._owner
        if owner is None or not self._mine():
            raise LockNotHeld(f"lock {self.name!r} is not held", name=self.name)
        keys = [self.keys.lock, self.keys.holder(owner)]
        try:
            code, value = yield scripts(self._conn).change, keys, [op, owner, reserve]
        except LockNotReplicated as error:
            code, value = (int(item) for item in error.replies[0])
            if code != Reply.DONE:
                return code, value, None
            return code, value, changed_unreplicated(self.name, error, intervals.CHANGED[op])
        return int(code), int(value), None

    @classmethod
    def _renew_script_call(cls, conn: Any, entries: list[RenewEntry]) -> ScriptCall:
        keys: list[bytes] = []
        args: list[Any] = []
        for handle, owner, ttl_ms, gen in entries:
            keys += (handle.keys.lock, handle.keys.holder(owner))
            args += (owner, ttl_ms, gen)
        return scripts(conn).renew, keys, args

    def _packed_holder(self) -> bytes:
        """``_describe_holder()`` packed as rw_acquire.lua's one holder argument, packed
        again only when those fields are another list (another thread or process)."""
        fields = self._describe_holder()
        packed = self._packed
        if packed is None or packed[0] is not fields:
            packed = self._packed = (fields, pack_holder(fields))
        return packed[1]

    def _changed_lost(self, op: str) -> LockError:
        error = self._lost_error(0, op)
        self._mark_lost(self._owner, error)
        return error

    # -- upgrade and downgrade ---------------------------------------------------------------

    def _upgrade(self, wait: float | None) -> Steps[bool]:
        """``upgrade``: True once upgraded, False if ``wait`` seconds passed first."""
        if self.mode != "u":
            kind = intervals.MODE_NAMES[self.mode]
            raise LockError(f"only an upgradable hold can upgrade ({kind})", name=self.name)
        wait = self.wait if wait is None else validate.check_wait(wait)
        if self._upgraded is True:
            return True
        reserve = wait > 0
        unreplicated: LockNotReplicated | None = None

        def attempt() -> Steps[tuple[bool, int]]:
            nonlocal unreplicated
            code, value, unreplicated = yield from self._change(
                "upgrade", reserve=RESERVATION_MS if reserve else 0
            )
            if code == Reply.PARENT_GONE:
                raise self._changed_lost("upgrade")
            return code == Reply.DONE, intervals.wait_hint(value, reserve)

        try:
            done, _ = yield from attempt()
            if not done and reserve:
                done, _ = yield from self._wait_for(attempt, wait, self._withdraw)
        except BaseException as exc:
            self._change_unanswered(exc)
            raise
        self._upgraded = done
        if unreplicated is not None:
            raise unreplicated  # upgraded on the master: the handle is the writer
        return done

    def _downgrade(self) -> Steps[None]:
        """``downgrade``: back from writer to upgradable."""
        if self._upgraded is False:
            raise LockNotHeld(f"the hold on {self.name!r} is not upgraded", name=self.name)
        try:
            code, _, unreplicated = yield from self._change("downgrade")
        except BaseException as exc:
            self._change_unanswered(exc)
            raise
        if code != Reply.DONE:
            raise self._changed_lost("downgrade")
        self._upgraded = False
        if unreplicated is not None:
            raise unreplicated

    def _change_unanswered(self, error: BaseException) -> None:
        """An upgrade or a downgrade ended with ``error``. One Redis answered (a LockError
        other than LockBackendError) says how the hold is; any other came after the change
        may have run (its reply lost, or cancelled while it was under way), so which mode
        the hold is in is no longer known."""
        if may_have_run(error):
            self._upgraded = None

    def _withdraw(self) -> Steps[None]:
        # The upgrade stopped waiting: drop its reservation (not the hold) and wake the
        # readers it held back.
        if self._mine():
            yield from self._change("unreserve")

    def _took(self, owner: str, token: int, sent_at: float) -> None:
        self._upgraded = False
        super()._took(owner, token, sent_at)

    def _release_steps(self, delay: float) -> Steps[None]:
        try:
            yield from super()._release_steps(delay)
        finally:
            # Upgraded only while held: a release that ran ends it, also one that then
            # raised (lost, not replicated); one that was not sent keeps it.
            self._upgraded = self._upgraded if self._mine() else False

    def _holders(self) -> Steps[list[HolderRecord]]:
        keys = self.keys
        blocked = self._owner is None
        # Asked by a handle that does not hold (a conflict's reason): only the holds in its
        # way; holds whose mode shares with its own are no reason it could not take it,
        # unless they are of its own call identity (HELD_BY_CALL).
        return intervals.holders_read(
            ("hgetall", keys.lock),
            lock_owners,
            keys.queue,
            keys.holder,
            lambda hold: (
                bool(hold)
                and (
                    not blocked
                    or self._in_the_way(hold.get(b"mode"))
                    or intervals.same_call(self.call, hold.get(b"call"))
                )
            ),
        )

    def _in_the_way(self, mode: bytes | None) -> bool:
        """Whether a hold of ``mode`` (as stored; None: unknown, counted in the way)
        conflicts with this one: not both shared (read beside read or upgradable)."""
        return mode is None or (text(mode), self.mode) not in _SHARED

    def _release_holder(self, process: ProcessOptions) -> Steps[bool]:
        return holds_released(self._conn, self.name, process)


class RWLockHandle(RWLockOps, LockHandle):
    """One hold of a reader-writer lock: ``kind`` is ``read``, ``upgradable`` or ``write``.

    Lease-like (``acquire``, ``release``, ``extend``, ``check``, ``token``, context manager).
    An upgradable hold can :meth:`upgrade` to the writer and :meth:`downgrade` back.
    """

    def __init__(
        self,
        client: Connection | HasConnection,
        name: str,
        mode: str,
        *,
        call: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(client, name, **options)
        self._set_mode(self._conn.prefix, mode, call)

    def upgrade(self, wait: float | None = None) -> bool:
        """Become the writer without letting go; True once upgraded, False if ``wait``
        seconds (default: the handle's own) passed first. While it waits, new readers wait
        too; readers already in are waited for. After an upgrade or a downgrade that raised
        LockBackendError (it may have run) it asks Redis, and answers as Redis has the
        hold."""
        return self._run(self._upgrade(wait))

    def downgrade(self) -> None:
        """Go back from writer to upgradable: readers may come in again at once."""
        self._run(self._downgrade())


H = TypeVar("H")


class RWLockMaker(Generic[H]):
    """A reader-writer lock on one name, making handles (not yet acquired) of one runner:
    :class:`RWLock` and the asyncio ``AsyncRWLock``."""

    def __init__(self, name: object, conn: Any, make: Callable[..., H]) -> None:
        self.name = validate.check_name(name)
        self._conn = conn
        self._make = make

    def read(self, **options: Any) -> H:
        """A shared hold: any number of readers, alongside at most one upgradable."""
        return self._make(self._conn, self.name, "r", **options)

    def upgradable(self, **options: Any) -> H:
        """A read hold that excludes other upgradables and can become the writer."""
        return self._make(self._conn, self.name, "u", **options)

    def write(self, **options: Any) -> H:
        """An exclusive hold; preferred over new readers while it waits."""
        return self._make(self._conn, self.name, "w", **options)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class RWLock(RWLockMaker[RWLockHandle]):
    """A reader-writer lock on one name; makes handles (not yet acquired).

    Options of every handle are those of :meth:`LockClient.lease`: ``ttl``, ``heartbeat``,
    ``max_hold``, ``wait``, ``owner_info``, ``on_lost``; and ``call``, the hold's call
    identity (see :func:`.intervals.check_call`).
    """

    def __init__(self, client: Connection | HasConnection, name: str) -> None:
        super().__init__(name, connection_of(client), RWLockHandle)


def lock_owners(fields: dict[Any, Any]) -> list[str]:
    """The owners the lock hash ``fields`` (bytes or str) names: its writer, its
    upgradable, its readers (a stale one among them while nobody dropped it: its holder
    hash is gone)."""
    owners = []
    for raw, value in fields.items():
        field = text(raw)
        if field in ("w", "u"):
            owners.append(text(value))
        elif field.startswith("r:"):
            owners.append(field[2:])
    return owners


def release_call(
    conn: ScriptHost,
    keys: RWKeys,
    owner: str,
    delay_ms: int,
    token: str = "",
    renewed_ms: str = "",
    *,
    mode: str = "",
    clear: bool = False,
) -> ScriptCall:
    """rw_release.lua on ``owner``'s hold (after a release delay of ``delay_ms``), only if its
    fencing token is ``token`` and its last renewal ``renewed_ms`` when they are given ('' where
    nothing is checked): for the sync and the asyncio holds, and, as a ``clear`` (its holder
    then finds the hold lost), for the admin and a supervisor. ``mode``: the hold's, as its
    holder knows it ('' unknown: read from its hash)."""
    args = [owner, delay_ms, token, renewed_ms, mode, "1" if clear else ""]
    return scripts(conn).release, [keys.lock, keys.holder(owner)], args


def release_hold(
    conn: Connection,
    keys: RWKeys,
    owner: str,
    delay_ms: int,
    token: str = "",
    renewed_ms: str = "",
) -> int:
    """One run of :func:`release_call` as a clear (the admin's, or a supervisor's release of
    a dead task's hold): a :class:`Reply` (DONE: released)."""
    call = release_call(conn, keys, owner, delay_ms, token, renewed_ms, clear=True)
    script, script_keys, args = call
    return Reply(int(conn.call(script, keys=script_keys, args=args)))


def clear_call(conn: ScriptHost, holder: ListedHolder) -> ScriptCall:
    """The release of one listed reader-writer hold, by its owner and fencing token (so a
    holder that left and came back under the same owner is left alone) and, when the listed
    holder has a ``renewed_ms``, only if not renewed since; codes as :func:`clear_hold`."""
    token, renewed = holder.token, holder.renewed_ms
    return release_call(
        conn,
        rw_keys(conn.prefix, holder.name),
        holder.owner or "",
        0,
        "" if token is None else str(token),
        "" if renewed is None else str(renewed),
        clear=True,
    )


def clear_hold(
    client: Connection | HasConnection,
    name: str,
    owner: str,
    *,
    token: int | None = None,
    renewed_ms: int | None = None,
) -> int:
    """:func:`clear_holder` with the script's :class:`Reply` (RESUMED: renewed since
    ``renewed_ms``, when given)."""
    name = validate.check_name(name)
    owner = validate.check_text(owner, "owner")
    token = validate.check_optional_token(token)
    conn = connection_of(client)
    return release_hold(
        conn,
        rw_keys(conn.prefix, name),
        owner,
        0,
        "" if token is None else str(token),
        "" if renewed_ms is None else str(int(renewed_ms)),
    )


def holds_released(conn: ConnectionBase, name: str, options: ProcessOptions) -> Steps[bool]:
    """Release (after its release delay) the holds of lock ``name`` that the run
    ``options`` names has; for a supervisor whose child can no longer release, and which
    knows no owner token. True if a hold was released; on a sync or an asyncio connection.

    It reads the lock hash, then the holds' hashes (a round trip each), then runs the release
    script on each match with the fencing token it read: that very hold goes, or nothing (it
    expired or was cleared meanwhile). Only after a crash, so a few round trips are fine."""
    name = validate.check_name(name)
    process = options.check()
    keys = rw_keys(conn.prefix, name)
    yield CheckLayout()
    owners = lock_owners((yield Command("hgetall", keys.lock)))
    return (
        yield from intervals.release_holds_of(
            name,
            owners,
            keys.holder,
            lambda owner, token: release_call(
                conn, keys, owner, process.delay_ms, token, clear=True
            ),
            process,
        )
    )


class RWFamilyAdmin(intervals.IntervalFamilyAdmin):
    """The admin functions of reader-writer locks: listed from their holder hashes as
    interval holds are (``B h:<owner>``, the same fields), cleared and released through
    their own scripts."""

    def clear_holder(
        self, client: Connection | HasConnection, name: str, owner: str, token: int | None = None
    ) -> bool:
        """Remove the holder ``owner`` of lock ``name`` atomically (only if its fencing
        token is still ``token``, when given) and wake waiters. True if removed."""
        return clear_hold(client, name, owner, token=token) == Reply.DONE

    def released(self, conn: ConnectionBase, name: str, process: ProcessOptions) -> Steps[bool]:
        return holds_released(conn, name, process)

    def clear_call(self, conn: ScriptHost, holder: ListedHolder) -> ScriptCall:
        return clear_call(conn, holder)


#: Listing, clearing and releasing a dead task's holds of reader-writer locks (the admin side).
ADMIN = RWFamilyAdmin(FAMILY)
list_holders = ADMIN.list_holders
clear_holder = ADMIN.clear_holder
release_holder = ADMIN.release_holder


__all__ = [
    "RWLock",
    "RWLockHandle",
    "RWLockOps",
    "RWLockMaker",
    "clear_holder",
    "list_holders",
    "release_holder",
]
