"""The interval engine under range locks and semaphores.

One named lock holds read, upgradable and write holds on closed intervals [lo, hi] of the
real line (reader-writer locks have a layout of their own: :mod:`.rwlock`). Each hold is
its own entry with its own expiry, so a crashed holder frees its share within its lease. The
Lua side (``lua/interval_*.lua``, with the shared helpers of
``lua/interval_common.lua`` and, but for the release, ``lua/interval_overlap.lua``
prepended) documents the layout::

    B exp            zset  owner -> expiry (server ms), every holder of every mode
    B r:lo, r:hi     zsets read holders by lo and by hi
    B u:lo, u:hi     zsets upgradable holders          B w:lo, w:hi   write holders
    B h:<owner>      hash  one holder: the lease fields + mode, lo, hi, parent
    B q:lo, q:hi, q:exp    reservations of waiting writers (short, renewed while waiting)
    B waiting        string: a waiter sleeps on the lock; releases publish only while it is there
    P{T}:fence       the fencing counter shared with the lease of the same name
    B chan           pub/sub channel woken by releases, shrinks and downgrades

with ``B = P{T}:range:`` for range locks and ``P{T}:sem:`` for semaphores. Acquire,
release, shrink, upgrade and downgrade are one script call each, O(log n) in the holders.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core import validate
from ..core.connection import Connection, ConnectionBase, HasConnection, connection_of
from ..core.handle import HolderRecord, LockHandle
from ..core.handle_ops import (
    HandleOps,
    changed_unreplicated,
    released_unreplicated,
    with_reply,
)
from ..core.heartbeat import RenewEntry
from ..core.holder import ListedHolder, decode, flatten, text
from ..core.keys import RELEASE_DELAY_STATE, RELEASED_STATE, escape_glob, name_tag
from ..core.options import ProcessOptions, options_after_two
from ..core.replication import Replication
from ..core.replies import Reply, acquire_outcome
from ..core.scan import Record, read_query
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
from ..core.steps import CheckLayout, Command, Pipeline, Steps
from ..core.validate import HolderProcess
from ..exceptions import ConfigurationError, LockError, LockNotHeld, LockNotReplicated

if TYPE_CHECKING:
    from redis.commands.core import Script

#: How long a waiting writer's reservation lasts; the waiter renews it every third of this,
#: so a writer that dies while waiting stops holding readers back within this time.
RESERVATION_MS = 1500

MODE_NAMES = {"r": "read", "u": "upgradable", "w": "write"}
#: Pairs of stored modes whose overlapping holds share: readers beside readers and beside
#: one upgradable reader.
_SHARED = frozenset((("r", "r"), ("r", "u"), ("u", "r")))


@dataclass(frozen=True)
class IntervalKeys:
    """The Redis names of one interval lock (see the module docstring)."""

    base: bytes
    indexes: tuple[bytes, ...]  # exp, r:lo, r:hi, u:lo, u:hi, w:lo, w:hi
    queue: tuple[bytes, bytes, bytes]  # q:lo, q:hi, q:exp
    waiting: bytes
    fence: bytes
    channel: bytes

    def holder(self, owner: str) -> bytes:
        return self.base + b"h:" + owner.encode()

    def all(self, owner: str) -> list[bytes]:
        """KEYS 1..13 of the acquire script (the release and change scripts take 1..12)."""
        return [*self.indexes, self.holder(owner), *self.queue, self.waiting, self.fence]


def interval_keys(prefix: str, name: str, family: bytes) -> IntervalKeys:
    """Keys of the interval lock ``name`` of ``family`` (``range``, ``sem``)."""
    slot = prefix.encode() + b"{" + name_tag(name) + b"}:"
    base = slot + family + b":"
    parts = (b"exp", b"r:lo", b"r:hi", b"u:lo", b"u:hi", b"w:lo", b"w:hi")
    return IntervalKeys(
        base=base,
        indexes=tuple(base + part for part in parts),
        queue=(base + b"q:lo", base + b"q:hi", base + b"q:exp"),
        waiting=base + b"waiting",
        fence=slot + b"fence",
        channel=base + b"chan",
    )


class IntervalScripts:
    """The interval scripts registered on one Redis client (no I/O); the acquire, release
    and change wait for ``replication``'s replicas (the heartbeat's batches add the
    renewals' WAIT)."""

    def __init__(self, redis: Any, replication: Replication | None = None) -> None:
        def load(name: str, waits: Replication | None, *preludes: str) -> Script:
            text = source_after(
                CLOCK, FENCING, *preludes, "interval_common", "interval_overlap", name
            )
            return register(redis, text, waits)

        self.acquire = load("interval_acquire", replication)
        # The release decides nothing on overlaps: it goes without their helpers.
        self.release = register(
            redis,
            source_after(CLOCK, ADVISORY, TRACE, "interval_common", "interval_release"),
            replication,
        )
        self.change = load("interval_change", replication)
        self.renew = load("interval_renew", None, "renew_hold")


def scripts(client: ScriptHost) -> IntervalScripts:
    """The interval scripts of ``client`` (sync or asyncio), registered on first use."""
    return bound_to(client, IntervalScripts)


def holder_reply(code: int) -> Reply:
    """What interval_release.lua's :class:`Reply` means to a holder releasing its own
    hold: DONE released, GONE gone; TAKEN and RESUMED answer only a release that checks a
    fencing token or a renewal time (a clear), and count as taken."""
    return Reply(code) if code in (Reply.DONE, Reply.GONE) else Reply.TAKEN


#: What each change of interval_change.lua did, as an error says it.
CHANGED = {
    "shrink": "shrunk",
    "upgrade": "upgraded",
    "downgrade": "downgraded",
    "unreserve": "unreserved",
}


def check_bound(value: object, argument: str) -> float:
    """A real number (``±math.inf`` allowed as open ends), never NaN or a bool."""
    return validate.check_real(value, argument)


def check_interval(lo: object, hi: object) -> tuple[float, float]:
    low, high = check_bound(lo, "lo"), check_bound(hi, "hi")
    if low > high:
        raise ConfigurationError("lo", f"must be <= hi, got lo={lo!r} > hi={hi!r}")
    return low, high


def score(value: float) -> str:
    """A bound as Redis and Lua parse it: ``repr`` round-trips every double."""
    return repr(value)


def check_call(call: object) -> str | None:
    """A hold's *call identity*: None (none), or a non-empty str naming one call of the
    caller's, opaque to the lock. Its acquire (read, upgradable, write or range hold,
    semaphore permit) is refused while a hold of the same call identity stands on the lock,
    in the same script call that would grant it: ``acquire`` returns False and
    ``held_by_call`` is True (``Reply.HELD_BY_CALL``), even where holds would share.
    For a caller whose one call may be started twice (a message delivered again) and must
    never hold beside itself. Stored in the hold's hash as ``call``."""
    return None if call is None else validate.check_text(call, "call")


def same_call(call: str | None, stored: bytes | None) -> bool:
    """Whether a hold hash's ``call`` field (as read; None: none) is call identity ``call``."""
    return call is not None and stored is not None and stored == call.encode()


def wait_hint(hint_ms: int, queued: bool) -> int:
    """How long a waiter whose interval acquire or upgrade failed may sleep: a queued
    writer wakes in time to renew its reservation."""
    return min(hint_ms, RESERVATION_MS // 3) if queued else hint_ms


class IntervalOps(HandleOps):
    """A hold on [lo, hi] in one mode ('r', 'u' or 'w'): its operations, for the sync
    (:class:`IntervalHandle`) and the asyncio handles."""

    _family = b"rw"
    mode: str
    lo: float
    hi: float
    _parent: IntervalOps | None
    #: The Redis keys of this hold (its holder hash, the name's indexes, channel).
    keys: IntervalKeys
    #: The last ``_describe_holder()`` list and its packed bytes (``_packed_holder``).
    _packed: tuple[list[Any], bytes] | None = None
    #: The call identity this hold is taken for (None: none); see :func:`check_call`.
    call: str | None = None

    def _set_interval(
        self,
        prefix: str,
        mode: str,
        lo: float,
        hi: float,
        parent: IntervalOps | None,
        call: object = None,
    ) -> None:
        self.call = check_call(call)
        self.mode = mode
        self.lo, self.hi = lo, hi
        self._parent = parent
        self.keys = interval_keys(prefix, self.name, self._family)
        self._channels = (self.keys.channel,)

    def _try_acquire(self, owner: str, reserve: bool) -> Steps[tuple[bool, int]]:
        keys, args, queued = self._acquire_call(owner, reserve)
        reply = yield scripts(self._conn).acquire, keys, args
        return self._acquired(reply, queued)

    def _abandon(self, owner: str) -> Steps[None]:
        # A waiting writer's reservation holds readers back: drop it.
        if self.mode == "w":
            yield from self._release(owner, 0)

    def _release(self, owner: str, delay_ms: int) -> Steps[int]:
        try:
            return holder_reply(int((yield release_call(self._conn, self.keys, owner, delay_ms))))
        except LockNotReplicated as exc:
            raise with_reply(exc, holder_reply(int(exc.replies[0]))) from exc

    def _change(
        self, op: str, lo: float = 0.0, hi: float = 0.0, reserve: int = 0
    ) -> Steps[tuple[int, int, LockNotReplicated | None]]:
        """One interval_change.lua round trip: its code and value, and the error to raise
        once the handle's state follows a change the replicas did not acknowledge (see
        :meth:`_changed_on_master`)."""
        keys, args = self._change_call(op, lo, hi, reserve)
        try:
            code, value = yield scripts(self._conn).change, keys, args
        except LockNotReplicated as exc:
            return self._changed_on_master(op, exc)
        return int(code), int(value), None

    def _changed_on_master(
        self, op: str, error: LockNotReplicated
    ) -> tuple[int, int, LockNotReplicated | None]:
        """A change ``op`` the replicas did not acknowledge (``error``), as the master
        answered it: its code and value, and the error to raise once the handle's state
        follows a change done there (None when nothing changed: the reply decides alone,
        as when replicated)."""
        code, value = (int(item) for item in error.replies[0])
        if code != Reply.DONE:
            return code, value, None
        return code, value, changed_unreplicated(self.name, error, CHANGED[op])

    @classmethod
    def _renew_script_call(cls, conn: Any, entries: list[RenewEntry]) -> ScriptCall:
        keys: list[bytes] = []
        args: list[Any] = []
        for handle, owner, ttl_ms, gen in entries:
            keys += (*handle.keys.indexes, handle.keys.holder(owner))
            args += (owner, ttl_ms, gen)
        return scripts(conn).renew, keys, args

    def _acquire_call(self, owner: str, reserve: bool) -> tuple[list[bytes], list[Any], bool]:
        """KEYS and ARGV of interval_acquire.lua for ``owner``, and whether it queues a
        waiting writer's reservation (``reserve``: the caller will wait)."""
        parent = ""
        if self._parent is not None:
            if not self._parent._mine() or self._parent._owner is None:
                raise LockNotHeld(
                    f"the upgradable hold on {self.name!r} is not held", name=self.name
                )
            parent = self._parent._owner
        queued = reserve and self.mode == "w"
        args = [
            owner, self.mode, score(self.lo), score(self.hi), self._ttl_ms, self._max_hold_ms,
            RESERVATION_MS if queued else 0, parent, self.keys.channel,
            "1" if reserve else "", self._packed_holder(), self.call or "",
        ]  # fmt: skip
        return self.keys.all(owner), args, queued

    def _packed_holder(self) -> bytes:
        """``_describe_holder()`` packed as interval_acquire.lua's one holder argument,
        packed again only when those fields are another list (another thread or process)."""
        fields = self._describe_holder()
        packed = self._packed
        if packed is None or packed[0] is not fields:
            packed = self._packed = (fields, pack_holder(fields))
        return packed[1]

    def _acquired(self, reply: Any, queued: bool) -> tuple[bool, int]:
        """interval_acquire.lua's reply: (True, token) or (False, ms a waiter may sleep)."""
        code, value = acquire_outcome(reply)
        if code == Reply.PARENT_GONE:
            raise LockNotHeld(
                f"the upgradable hold on {self.name!r} is gone or does not cover"
                f" [{self.lo}, {self.hi}]",
                name=self.name,
            )
        if code == Reply.DONE:
            return True, value
        if code == Reply.HELD_BY_CALL:
            return self._refused_for_call(value)
        return False, wait_hint(value, queued)

    def _change_call(
        self, op: str, lo: float = 0.0, hi: float = 0.0, reserve: int = 0
    ) -> tuple[list[bytes], list[Any]]:
        """KEYS and ARGV of interval_change.lua (shrink, upgrade, downgrade, unreserve)."""
        owner = self._owner
        if owner is None or not self._mine():
            raise LockNotHeld(f"lock {self.name!r} is not held", name=self.name)
        keys = self.keys.all(owner)[:12]
        return keys, [op, owner, score(lo), score(hi), reserve, self.keys.channel]

    def _changed_lost(self, op: str) -> LockError:
        error = self._lost_error(0, op)
        self._mark_lost(self._owner, error)
        return error

    def _inside(self, lo: object, hi: object, held: str) -> tuple[float, float]:
        """[lo, hi] checked, and inside this hold (``held`` names it in the error)."""
        low, high = check_interval(lo, hi)
        if low < self.lo or high > self.hi:
            raise ConfigurationError(
                "lo", f"[{lo}, {hi}] is not inside the {held} [{self.lo}, {self.hi}]"
            )
        return low, high

    def _holders(self) -> Steps[list[HolderRecord]]:
        keys = self.keys
        blocked = self._owner is None
        # Asked by a handle that does not hold (a conflict's reason): only the holds in its
        # way; a range lock's holders of disjoint ranges, and holds whose mode shares with
        # its own, are no reason it could not take it, unless they are of its own call
        # identity (HELD_BY_CALL).
        return holders_read(
            ("zrange", keys.indexes[0], 0, -1),  # every holder, by expiry
            lambda held: [text(owner) for owner in held],
            keys.queue[2],
            keys.holder,
            lambda hold: (
                not blocked
                or self._in_the_way(hold.get(b"mode"), hold.get(b"lo"), hold.get(b"hi"))
                or same_call(self.call, hold.get(b"call"))
            ),
        )

    def _in_the_way(self, mode: bytes | None, lo: bytes | None, hi: bytes | None) -> bool:
        """Whether a hold of ``mode`` on [lo, hi] (as stored; None: unknown, counted in the
        way) conflicts with this one: overlapping, and not both shared (read beside read or
        upgradable; one upgradable at a time)."""
        if mode is None or lo is None or hi is None:
            return True
        if float(lo) > self.hi or float(hi) < self.lo:
            return False
        return (text(mode), self.mode) not in _SHARED

    def _release_holder(self, process: ProcessOptions) -> Steps[bool]:
        return holds_released(self._conn, self._family, self.name, process)


class IntervalHandle(IntervalOps, LockHandle):
    """A hold on [lo, hi] of an interval lock, in one mode ('r', 'u' or 'w')."""

    def __init__(
        self,
        client: Connection | HasConnection,
        name: str,
        mode: str,
        lo: float,
        hi: float,
        *,
        parent: IntervalHandle | None = None,
        call: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(client, name, **options)
        self._set_interval(self._conn.prefix, mode, lo, hi, parent, call)


def holders_read(
    owners_read: tuple[Any, ...],
    owners_of: Callable[[Any], list[str]],
    queue: bytes,
    holder_key: Callable[[str], bytes],
    keep: Callable[[dict[bytes, Any]], bool],
) -> Steps[list[HolderRecord]]:
    """The holders of an interval or reader-writer lock: the owners (``owners_of`` the
    reply to the command ``owners_read``) and the writers waiting in ``queue`` in one round
    trip, then the holder hashes (``holder_key(owner)``) of those ``keep`` keeps (a hold
    released since its owner was read left a trace: read as gone, an empty dict). A writer
    waiting for its turn holds new readers back without holding anything yet."""
    found, writers = yield Pipeline([owners_read, ("zrange", queue, 0, -1)])
    owners = owners_of(found)
    replies = (yield Pipeline([("hgetall", holder_key(o)) for o in owners])) if owners else []
    holds = [{} if released(flat) else flat for flat in map(flatten, replies)]
    holders = [
        HolderRecord(
            owner=owner,
            task_id=optional_text(hold.get(b"task_id")),
            send=optional_text(hold.get(b"send")),
        )
        for owner, hold in zip(owners, holds, strict=True)
        if keep(hold)
    ]
    return holders + [HolderRecord(owner=text(o), task_id=None, waiting=True) for o in writers]


def optional_text(value: Any) -> str | None:
    """``value`` as text; None stays None."""
    return None if value is None else text(value)


def released(fields: dict[bytes, Any]) -> bool:
    """Whether the hold hash ``fields`` (as read) is the trace of a hold its holder released
    or a clear freed (``RELEASED_STATE``): it holds nothing."""
    return fields.get(b"state") == RELEASED_STATE.encode()


def list_holders(
    client: Connection | HasConnection, family: bytes, pattern: str | None
) -> list[dict[str, Any]]:
    """Every holder of every ``family`` interval lock under the client's prefix whose name
    matches the glob ``pattern`` (None: all), decoded."""
    conn = connection_of(client)
    found = holders_of(read_query(conn, holder_match(conn.prefix, family)).records, pattern)
    return [holder.as_dict() for holder in found]


def holder_match(prefix: str, family: bytes) -> bytes:
    """The SCAN glob of the holder hashes (``B h:<owner>``) of every ``family`` interval
    lock under ``prefix``."""
    return escape_glob(prefix.encode()) + b"{*}:" + family + b":h:*"


def holders_of(records: list[Record], pattern: str | None) -> list[ListedHolder]:
    """The holders among interval holder-hash ``records`` whose lock name matches the glob
    ``pattern`` (None: all), decoded, with their mode named (read, upgradable, write); the
    hashes of holds released or cleared (``RELEASED_STATE``) hold nothing and are left
    out."""
    holders = []
    for fields, pttl in records:
        record = decode(fields, pttl)
        if record.state == RELEASED_STATE:
            continue
        if record.mode is not None:
            record = dataclasses.replace(record, mode=MODE_NAMES.get(record.mode, record.mode))
        if pattern is None or fnmatch.fnmatchcase(record.name, pattern):
            holders.append(record)
    return holders


def clear_holder(
    client: Connection | HasConnection,
    family: bytes,
    name: str,
    owner: str,
    token: int | None = None,
) -> bool:
    """Remove the holder ``owner`` of interval lock ``name`` (if ``token`` is given, only if
    that is still its fencing token) and wake waiters. True if something was removed."""
    return clear_hold(client, family, name, owner, token=token) == Reply.DONE


def clear_hold(
    client: Connection | HasConnection,
    family: bytes,
    name: str,
    owner: str,
    *,
    token: int | None = None,
    renewed_ms: int | None = None,
) -> int:
    """:func:`clear_holder` for the admin tools, with the script's :class:`Reply`
    (RESUMED: renewed since ``renewed_ms``, when given: the renewal time it had when listed
    stale, so a holder whose heartbeat resumed stays)."""
    name = validate.check_name(name)
    owner = validate.check_text(owner, "owner")
    token = validate.check_optional_token(token)
    conn = connection_of(client)
    keys = interval_keys(conn.prefix, name, family)
    return release_hold(
        conn,
        keys,
        owner,
        0,
        "" if token is None else str(token),
        "" if renewed_ms is None else str(int(renewed_ms)),
    )


def clear_call(conn: ScriptHost, family: bytes, holder: ListedHolder) -> ScriptCall:
    """The release of one listed hold of an interval lock, by its owner and fencing token
    (so a holder that left and came back under the same owner is left alone) and, when the
    listed holder has a ``renewed_ms``, only if not renewed since; codes as :func:`clear_hold`."""
    token, renewed = holder.token, holder.renewed_ms
    return release_call(
        conn,
        interval_keys(conn.prefix, holder.name, family),
        holder.owner or "",
        0,
        "" if token is None else str(token),
        "" if renewed is None else str(renewed),
        clear=True,
    )


def release_hold(
    conn: Connection,
    keys: IntervalKeys,
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


def release_call(
    conn: ScriptHost,
    keys: IntervalKeys,
    owner: str,
    delay_ms: int,
    token: str = "",
    renewed_ms: str = "",
    *,
    clear: bool = False,
) -> ScriptCall:
    """interval_release.lua on ``owner``'s hold (after a release delay of ``delay_ms``), only if
    its fencing token is ``token`` and its last renewal ``renewed_ms`` when they are given
    ('' where nothing is checked): for the sync and the asyncio holds, and, as a ``clear``
    (its holder then finds the hold lost), for the admin and a supervisor."""
    args = [owner, delay_ms, keys.channel, token, renewed_ms, "1" if clear else ""]
    return scripts(conn).release, keys.all(owner)[:12], args


def holds_released(
    conn: ConnectionBase, family: bytes, name: str, options: ProcessOptions
) -> Steps[bool]:
    """Release (after its release delay) the holds of interval lock ``name`` of
    ``family`` that the run ``options`` names has; for a supervisor (the Celery worker's
    main process) whose child can no longer release, and which knows no owner token. True
    if a hold was released; on a sync or an asyncio connection.

    It reads the owners, then their holder fields (a round trip each), then runs the release
    script on each match with the fencing token it read: that very hold goes, or nothing (it
    expired or was cleared meanwhile). Only after a crash, so a few round trips are fine."""
    name = validate.check_name(name)
    process = options.check()
    keys = interval_keys(conn.prefix, name, family)
    yield CheckLayout()
    owners = [text(raw) for raw in (yield Command("zrange", keys.indexes[0], 0, -1))]
    return (
        yield from release_holds_of(
            name,
            owners,
            keys.holder,
            lambda owner, token: release_call(
                conn, keys, owner, process.delay_ms, token, clear=True
            ),
            process,
        )
    )


def release_holds_of(
    name: str,
    owners: list[str],
    holder_key: Callable[[str], bytes],
    release: Callable[[str, str], ScriptCall],
    process: HolderProcess,
) -> Steps[bool]:
    """Of the holds of ``owners`` (on lock ``name``), release those whose holder hash
    (``holder_key(owner)``) names the task, pid and host of ``process`` (and a process mark
    that begins with its ``proc``, when the hash has one), each by the call ``release(owner,
    fencing token read)``: that very hold goes, or nothing (it expired or was cleared
    meanwhile). True if a hold was released."""
    if not owners:
        return False
    fields = (b"task_id", b"pid", b"host", b"token", b"state", b"proc")
    replies = yield Pipeline([("hgetall", holder_key(owner)) for owner in owners])
    # The host and the place its process mark names too: pids are reused across machines
    # and containers.
    wanted = (process.task_id.encode(), str(process.pid).encode(), process.host.encode())
    place = process.proc.encode()
    released = False
    unreplicated: LockNotReplicated | None = None
    for owner, flat in zip(owners, map(flatten, replies), strict=True):
        held_by, held_in, held_on, token, state, proc = (flat.get(field) for field in fields)
        # A hold in a release delay was released already: its delay must not start again;
        # nor does a hold released or cleared hold anything.
        if (
            (held_by, held_in, held_on) != wanted
            or (proc is not None and not proc.startswith(place))
            or token is None
            or state in (RELEASE_DELAY_STATE.encode(), RELEASED_STATE.encode())
        ):
            continue
        try:
            code = int((yield release(owner, token.decode())))
        except LockNotReplicated as exc:
            # Released on the master: go on with the other holds, then say so.
            code, unreplicated = int(exc.replies[0]), exc
        released = code == Reply.DONE or released
    if unreplicated is not None:
        raise released_unreplicated(name, unreplicated, "released")
    return released


class IntervalFamilyAdmin:
    """The admin functions of one family of interval locks (``rw`` or ``range``), which
    :mod:`.rwlock` and :mod:`.rangelock` publish as their module functions."""

    def __init__(self, family: bytes) -> None:
        self.family = family

    def list_holders(
        self, client: Connection | HasConnection, pattern: str | None = None
    ) -> list[dict[str, Any]]:
        """Every holder of this family under the client's prefix whose lock name matches
        the glob ``pattern`` (None: all), decoded: ``kind`` is read, upgradable or write (as
        it holds now) for a reader-writer lock, range for a range lock (with ``mode``,
        ``lo`` and ``hi``)."""
        return list_holders(client, self.family, pattern)

    def clear_holder(
        self, client: Connection | HasConnection, name: str, owner: str, token: int | None = None
    ) -> bool:
        """Remove the holder ``owner`` of lock ``name`` atomically (only if its fencing
        token is still ``token``, when given) and wake waiters. True if removed."""
        return clear_holder(client, self.family, name, owner, token)

    @options_after_two(ProcessOptions)
    def release_holder(
        self, client: Connection | HasConnection, name: str, process: ProcessOptions
    ) -> bool:
        """Release (after a release delay of ``delay`` seconds) the holds of lock ``name`` that
        task ``task_id`` in process ``pid`` on ``host`` (default: this machine) has: for a
        supervisor whose child can no longer release. True if a hold was released."""
        conn = connection_of(client)
        return conn.run(self.released(conn, name, process))

    def released(self, conn: ConnectionBase, name: str, process: ProcessOptions) -> Steps[bool]:
        """:meth:`release_holder`'s steps."""
        return holds_released(conn, self.family, name, process)

    def clear_call(self, conn: ScriptHost, holder: ListedHolder) -> ScriptCall:
        """The clear of one listed hold of this family (the admin's ``clear``)."""
        return clear_call(conn, self.family, holder)
