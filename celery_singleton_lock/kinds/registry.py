"""The registry of lock kinds: what the admin side needs of each family of kinds, so it reads
this table instead of importing each kind.

A family is listed from a *keyspace*: the keys one listing reads (one SCAN, or the one key a
literal pattern names). Families sharing a keyspace (leases and multi-key locks both live
in lease keys) share one read of it in a listing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.connection import Connection, HasConnection
from ..core.scan import Record, read_hashes
from . import intervals, lease, multi, rangelock, rwlock

#: One holder of one lock, as a kind's lister returns it (see admin.inspect for the fields).
Holder = dict[str, Any]


class ReleaseHolder(Protocol):
    """Release what task ``task_id`` in process ``pid`` on ``host`` holds of lock ``name``
    (a multi-key lock: of its names), after ``delay`` seconds of delay-after; True if
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


@dataclass(frozen=True)
class KindFamily:
    """How one family of lock kinds is listed, cleared and released for a dead holder."""

    #: The family's name: ``lease``, ``multi``, ``rw`` or ``range``.
    family: str
    #: The ``kind`` values of its holders.
    kinds: tuple[str, ...]
    #: Names the keys ``keys`` returns: families with the same keyspace share one read.
    keyspace: str
    #: The keys a listing of a glob pattern (None: all) reads.
    keys: Callable[[Connection, str | None], list[bytes]]
    #: The family's holders among the records read from those keys, matching the pattern.
    holders: Callable[[list[Record], str | None], list[Holder]]
    #: Clear a listed holder if it still holds (and, when the holder dict has a
    #: ``renewed_ms``, was not renewed since): 1 cleared, 0 gone, -1 taken, -2 renewed.
    clear_holder: Callable[[Connection, Holder], int]
    release_holder: ReleaseHolder

    def list_holders(self, conn: Connection, pattern: str | None) -> list[Holder]:
        """The family's holders whose name matches the glob ``pattern`` (None: all)."""
        return self.holders(read_hashes(conn, self.keys(conn, pattern)), pattern)


def _interval_family(
    name: str, admin: intervals.IntervalFamilyAdmin, kinds: tuple[str, ...]
) -> KindFamily:
    """A family of interval locks (``rw`` or ``range``): its holder hashes are its keyspace."""
    family = admin.family

    def keys(conn: Connection, pattern: str | None) -> list[bytes]:
        return intervals.holder_keys(conn, family)

    def holders(records: list[Record], pattern: str | None) -> list[Holder]:
        return intervals.holders_of(records, family, pattern)

    def clear_holder(conn: Connection, holder: Holder) -> int:
        return intervals.clear_listed(conn, family, holder)

    return KindFamily(name, kinds, name, keys, holders, clear_holder, admin.release_holder)


LEASES = KindFamily(
    family="lease",
    kinds=("lease",),
    keyspace="lease",
    keys=lease.lease_keys,
    holders=lease.lease_holders,
    clear_holder=lease.clear_holder,
    release_holder=lease.release_holder,
)

FAMILIES: tuple[KindFamily, ...] = (
    LEASES,
    _interval_family("rw", rwlock.ADMIN, ("read", "write", "upgradable")),
    _interval_family("range", rangelock.ADMIN, ("range",)),
    # A multi-key lock holds each name in a lease's hash: listed from the lease keys, and
    # cleared as leases are, by fencing token, one name at a time.
    KindFamily(
        family="multi",
        kinds=("multi",),
        keyspace="lease",
        keys=lease.lease_keys,
        holders=multi.multi_holders,
        clear_holder=lease.clear_holder,
        release_holder=multi.release_holder,
    ),
)


def family_of(kind: str) -> KindFamily | None:
    """The family whose holders have ``kind`` (None: no such kind)."""
    for family in FAMILIES:
        if kind in family.kinds:
            return family
    return None
