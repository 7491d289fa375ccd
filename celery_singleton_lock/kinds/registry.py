"""The registry of lock kinds: what the admin side and the makers of handles need of each
family of kinds, so they read this table instead of importing each kind.

A family is listed from a *keyspace*: the keys one listing reads (one SCAN, or the one key a
literal pattern names). Families sharing a keyspace (leases and multi-key locks both live
in lease keys) share one read of it in a listing. What a family says of its keys, holders
and clearing is pure (a key query, a decoding, a script call), so the sync admin and the
asyncio one each do the I/O their way and share everything else.

A family also makes its handles from what is locked (a :class:`Target`: a name; the names
of a multi-key lock; a name with the bounds of a range hold) and a mode, through a
:class:`HandleMaker` whose ttl and max-hold are checked once: the Celery layer picks the
family from a task's options and makes one handle per run. Every family's makers are named
alike: ``<family>_handles(conn, ttl, max_hold)`` checks the options and returns the family's
:class:`HandleMaker`, which ``make_<family>`` (one handle on a connection) is behind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from ..core.connection import Connection, HasConnection
from ..core.handle import LockHandle
from ..core.holder import ListedHolder
from ..core.scan import KeyQuery, Record
from ..core.scripts import ScriptCall, ScriptHost
from ..exceptions import ConfigurationError
from . import intervals, lease, lease_listing, multi, rangelock, rwlock, semaphore


class ReleaseHolder(Protocol):
    """Release what task ``task_id`` in process ``pid`` on ``host`` holds of lock ``name``
    (a multi-key lock: of its names), after a release delay of ``delay`` seconds; True if
    something was released. For a supervisor whose child died holding it."""

    def __call__(
        self,
        client: Connection | HasConnection,
        name: Any,
        /,
        *,
        task_id: str,
        pid: int,
        host: str | None = None,
        delay: float = 0.0,
    ) -> bool: ...


class Target(NamedTuple):
    """What one handle locks: lock ``name`` (a range lock: the resource; a multi-key lock:
    its names joined with " + "), the ``names`` of a multi-key lock, or the ``bounds``
    (lo, hi) of a range hold. A family reads what it needs."""

    name: str
    names: tuple[str, ...] = ()
    bounds: tuple[float, float] | None = None


class HandleMaker(Protocol):
    """Makes handles (not yet acquired) of one family, with the ttl and max-hold it was made
    for: a handle in ``mode`` (one of the family's ``modes``) on ``target``, with the call
    identity ``call`` where the family's holds take one (the shared kinds: reader-writer,
    range, semaphore; see ``intervals.check_call``); leases and multi-key locks, exclusive,
    have none and go without. Positional only, so that a task run pays for no keywords."""

    def __call__(
        self,
        target: Target,
        mode: str,
        owner_info: dict[str, Any] | None,
        on_lost: Callable[[Any], object] | None,
        call: str | None,
        /,
    ) -> LockHandle: ...


class FamilyHandles(Protocol):
    """A family's ``handles`` (``<family>_handles``): its handle maker for leases of ``ttl``
    seconds capped at ``max_hold`` (passed by keyword where the task's options meet it: both
    are seconds)."""

    def __call__(self, conn: Connection, ttl: float, max_hold: float | None) -> HandleMaker: ...


@dataclass(frozen=True)
class KindFamily:
    """How one family of lock kinds is listed, cleared and released for a dead holder."""

    #: The family's name: ``lease``, ``multi``, ``rw`` or ``range``.
    family: str
    #: The ``kind`` values of its holders.
    kinds: tuple[str, ...]
    #: Names the keys ``keys`` returns: families with the same keyspace share one read.
    keyspace: str
    #: ``keys(prefix, pattern)``: the keys a listing of a glob pattern (None: all) reads.
    keys: Callable[[str, str | None], KeyQuery]
    #: The family's holders among the records read from those keys, matching the pattern.
    holders: Callable[[list[Record], str | None], list[ListedHolder]]
    #: The script call that clears a listed holder if it still holds (and, when the holder
    #: has a ``renewed_ms``, was not renewed since); it answers a ``Reply``
    #: (core/replies.py).
    clear_call: Callable[[ScriptHost, ListedHolder], ScriptCall]
    release_holder: ReleaseHolder
    #: The modes its handles are made in (``exclusive``: one holder, no sharing).
    modes: tuple[str, ...]
    #: ``handles(conn, ttl, max_hold)``: its handle maker for leases of ``ttl`` seconds
    #: held at most ``max_hold`` seconds (checked here, once, not per handle).
    handles: FamilyHandles


def lease_handles(conn: Connection, ttl: float, max_hold: float | None) -> HandleMaker:
    """Leases through a LeaseMaker: the ttl and max-hold are checked here, not per lease
    (a default task makes one lease per run)."""
    make = lease.LeaseMaker(conn, ttl=ttl, max_hold=max_hold).lease
    # An exclusive lease has no call identity: a copy of a call is kept out by the lease
    # itself, and meets its own hold on the conflict path.
    return lambda target, mode, owner_info, on_lost, call: make(
        target.name, owner_info=owner_info, on_lost=on_lost
    )


#: Makes one handle of a family (as a :class:`HandleMaker` does, on a connection), with the
#: handle keywords ``ttl``, ``max_hold``, ``owner_info`` and ``on_lost`` (and ``call``, for
#: the families whose holds take one) in a dict.
MakeHandle = Callable[[Connection, Target, str, dict[str, Any]], LockHandle]


def _family_handles(make: MakeHandle, *, calls: bool = True) -> FamilyHandles:
    """A family's ``handles`` from its ``make``: the handle checks its own options. With
    ``calls`` the handles get the maker's call identity (``call``); without, it is
    dropped (an exclusive kind has none)."""

    def handles(conn: Connection, ttl: float, max_hold: float | None) -> HandleMaker:
        def options(owner_info: Any, on_lost: Any, call: str | None) -> dict[str, Any]:
            made = {"ttl": ttl, "max_hold": max_hold, "owner_info": owner_info, "on_lost": on_lost}
            if calls:
                made["call"] = call
            return made

        return lambda target, mode, owner_info, on_lost, call: make(
            conn, target, mode, options(owner_info, on_lost, call)
        )

    return handles


def make_multi(conn: Connection, target: Target, mode: str, options: dict[str, Any]) -> LockHandle:
    return multi.MultiLease(conn, target.names, **options)


def make_rw(conn: Connection, target: Target, mode: str, options: dict[str, Any]) -> LockHandle:
    make: Callable[..., LockHandle] = getattr(rwlock.RWLock(conn, target.name), mode)
    return make(**options)


def make_range(conn: Connection, target: Target, mode: str, options: dict[str, Any]) -> LockHandle:
    if target.bounds is None:
        raise ConfigurationError("bounds", f"a range lock on {target.name!r} needs bounds")
    lock = rangelock.RangeLock(conn, target.name)
    make: Callable[..., LockHandle] = getattr(lock, "write" if mode == "exclusive" else mode)
    return make(*target.bounds, **options)


rw_handles = _family_handles(make_rw)
range_handles = _family_handles(make_range)
# An exclusive kind: its handles take no call identity.
multi_handles = _family_handles(make_multi, calls=False)


def _interval_family(
    name: str,
    admin: intervals.IntervalFamilyAdmin,
    kinds: tuple[str, ...],
    modes: tuple[str, ...],
    handles: FamilyHandles,
    holders: Callable[[list[Record], str | None], list[ListedHolder]] = intervals.holders_of,
) -> KindFamily:
    """A family of interval holds (``rw``, ``range``, ``semaphore``): its holder hashes are
    its keyspace."""
    family = admin.family

    def keys(prefix: str, pattern: str | None) -> KeyQuery:
        return intervals.holder_match(prefix, family)

    def clear_call(conn: ScriptHost, holder: ListedHolder) -> ScriptCall:
        return admin.clear_call(conn, holder)

    release = admin.release_holder
    return KindFamily(name, kinds, name, keys, holders, clear_call, release, modes, handles)


#: The modes of reader-writer holds: shared, shared but upgradable, exclusive.
MODES = ("read", "upgradable", "write")

LEASES = KindFamily(
    family="lease",
    kinds=("lease",),
    keyspace="lease",
    keys=lease_listing.lease_keys,
    holders=lease_listing.lease_holders,
    clear_call=lease_listing.clear_call,
    release_holder=lease.release_holder,
    modes=("exclusive",),
    handles=lease_handles,
)


def permit_handles(conn: Connection, ttl: float, max_hold: float | None, limit: int) -> HandleMaker:
    """The handle maker of permits of semaphores of ``limit`` permits, with ttl and
    max-hold as a family's ``handles`` takes them: the Celery layer calls it with the task's
    ``lock_limit``, which the family's ``handles`` has no way to receive."""
    checked = semaphore.check_limit(limit)

    def make_permit(
        conn: Connection, target: Target, mode: str, options: dict[str, Any]
    ) -> LockHandle:
        return semaphore.Permit(conn, target.name, checked, **options)

    return _family_handles(make_permit)(conn, ttl, max_hold)


def semaphore_handles(conn: Connection, ttl: float, max_hold: float | None) -> HandleMaker:
    """The semaphore family's ``handles``: a permit cannot be made without its limit."""
    raise ConfigurationError("limit", "a semaphore's permits need a limit: use permit_handles")


#: A semaphore's permits are interval holds under their own family key (``P{T}:sem:``):
#: listed from their holder hashes, cleared by owner and fencing token as interval holds are.
SEMAPHORES = _interval_family(
    "semaphore",
    semaphore.ADMIN,
    (semaphore.KIND,),
    ("exclusive",),
    semaphore_handles,
    semaphore.holders_of,
)

FAMILIES: tuple[KindFamily, ...] = (
    LEASES,
    _interval_family("rw", rwlock.ADMIN, ("read", "write", "upgradable"), MODES, rw_handles),
    # "exclusive" on a range is a write hold.
    _interval_family("range", rangelock.ADMIN, ("range",), ("exclusive", *MODES), range_handles),
    # A multi-key lock holds each name in a lease's hash: listed from the lease keys, and
    # cleared as leases are, by fencing token, one name at a time.
    KindFamily(
        family="multi",
        kinds=("multi",),
        keyspace="lease",
        keys=lease_listing.lease_keys,
        holders=multi.multi_holders,
        clear_call=lease_listing.clear_call,
        release_holder=multi.release_holder,
        modes=("exclusive",),
        handles=multi_handles,
    ),
    SEMAPHORES,
)


def family_of(kind: str) -> KindFamily | None:
    """The family whose holders have ``kind`` (None: no such kind)."""
    for family in FAMILIES:
        if kind in family.kinds:
            return family
    return None


def family_named(family: str) -> KindFamily:
    """The family called ``family`` (``lease``, ``multi``, ``rw``, ``range``,
    ``semaphore``)."""
    for found in FAMILIES:
        if found.family == family:
            return found
    known = ", ".join(found.family for found in FAMILIES)
    raise ConfigurationError("family", f"no lock family {family!r} (known: {known})")
