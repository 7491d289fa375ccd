"""Counting semaphores: at most ``limit`` permits of one name held at once.

Each permit is a lease of its own: its own owner, fencing token (from the counter shared with
the lease of the same name, so strictly increasing per name), heartbeat-renewed expiry (a
holder that dies frees its permit within its ttl) and holder record. Built on the interval
engine (:mod:`.intervals`): a permit is stored as a shared hold on [-inf, +inf] under
``P{T}:sem:``, which the interval release, renewal, listing and clearing serve unchanged;
only the acquire is its own script (``lua/semaphore_acquire.lua``), which counts the permits
held against the limit. Releases wake the waiters through the semaphore's channel.

The limit is the acquiring call's: handles of one name made with different limits each check
theirs against the permits held when they acquire (holders already in keep their permits).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..core import validate
from ..core.connection import Connection, HasConnection, connection_of
from ..core.holder import ListedHolder
from ..core.replication import Replication
from ..core.replies import Reply, acquire_outcome
from ..core.scan import Record, read_query
from ..core.scripts import CLOCK, FENCING, ScriptHost, bound_to, register, source_after
from ..core.steps import Steps
from . import intervals
from .intervals import IntervalHandle, IntervalOps

if TYPE_CHECKING:
    from redis.commands.core import Script

FAMILY = b"sem"
KIND = "semaphore"


class SemaphoreScripts:
    """The semaphore's own script registered on one Redis client (no I/O), waiting for
    ``replication``'s replicas; the release and renewal are the interval engine's."""

    def __init__(self, redis: Any, replication: Replication | None = None) -> None:
        text = source_after(
            CLOCK, FENCING, "interval_common", "interval_overlap", "semaphore_acquire"
        )
        self.acquire: Script = register(redis, text, replication)


def scripts(client: ScriptHost) -> SemaphoreScripts:
    """The semaphore scripts of ``client`` (sync or asyncio), registered on first use."""
    return bound_to(client, SemaphoreScripts)


def check_limit(limit: object) -> int:
    """A semaphore's limit: an int >= 1 (never a bool or a float)."""
    return validate.check_token(limit, "limit")


class PermitOps(IntervalOps):
    """A permit's operations, for the sync :class:`Permit` and the asyncio one: its own
    acquire script; the release, renewal and admin side are the interval hold's."""

    kind = KIND
    _family = FAMILY
    #: How many permits of the name this permit's acquire allows at once.
    limit: int

    def _try_acquire(self, owner: str, reserve: bool) -> Steps[tuple[bool, int]]:
        args = [
            owner, self.limit, self._ttl_ms, self._max_hold_ms,
            "1" if reserve else "", self.call or "", *self._describe_holder(),
        ]  # fmt: skip
        reply = yield scripts(self._conn).acquire, self.keys.all(owner), args
        code, value = acquire_outcome(reply)
        if code == Reply.HELD_BY_CALL:
            return self._refused_for_call(value)
        return code == Reply.DONE, value

    def _in_the_way(self, mode: bytes | None, lo: bytes | None, hi: bytes | None) -> bool:
        """At the limit every permit held is in the way, whatever its stored mode."""
        return True

    def __repr__(self) -> str:
        state = "lost" if self.lost else "held" if self.held else "free"
        return f"<{type(self).__name__} {self.name!r} of {self.limit} {state}>"


class Permit(PermitOps, IntervalHandle):
    """One permit of a semaphore. Lease-like (``acquire``, ``release``, ``extend``,
    ``check``, ``token``, ``holders``, context manager)."""

    def __init__(
        self, client: Connection | HasConnection, name: str, limit: int, **options: Any
    ) -> None:
        self.limit = check_limit(limit)
        super().__init__(client, name, "r", -math.inf, math.inf, **options)


H = TypeVar("H")


class SemaphoreMaker(Generic[H]):
    """A counting semaphore on one name, making permits (not yet acquired) of one runner:
    :class:`Semaphore` and the asyncio ``AsyncSemaphore``."""

    def __init__(self, name: object, limit: object, conn: Any, make: Callable[..., H]) -> None:
        self.limit = check_limit(limit)
        self.name = validate.check_name(name)
        self._conn = conn
        self._make = make

    def permit(self, **options: Any) -> H:
        """One permit (not yet acquired): its acquire succeeds while fewer than ``limit``
        permits of the name are held, else waits (up to ``wait``) for a release."""
        return self._make(self._conn, self.name, self.limit, **options)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} limit={self.limit}>"


class Semaphore(SemaphoreMaker[Permit]):
    """A counting semaphore on one name: at most ``limit`` permits held at once; makes
    permits (not yet acquired).

    Options of :meth:`permit` are those of :meth:`LockClient.lease`: ``ttl``, ``heartbeat``,
    ``max_hold``, ``wait``, ``owner_info``, ``on_lost``; and ``call``, the permit's call
    identity: no call holds two permits at once (see :func:`.intervals.check_call`).
    """

    def __init__(self, client: Connection | HasConnection, name: str, limit: int) -> None:
        super().__init__(name, limit, connection_of(client), Permit)


def holders_of(records: list[Record], pattern: str | None) -> list[ListedHolder]:
    """The permits among holder-hash ``records`` whose semaphore name matches the glob
    ``pattern`` (None: all), decoded: ``kind`` semaphore and ``limit`` the limit of the call
    that took the permit; no mode or bounds, which every permit shares."""
    return [
        dataclasses.replace(holder, mode=None, lo=None, hi=None)
        for holder in intervals.holders_of(records, pattern)
    ]


#: Listing, clearing and releasing a dead task's permits (the admin side).
ADMIN = intervals.IntervalFamilyAdmin(FAMILY)
clear_holder = ADMIN.clear_holder
release_holder = ADMIN.release_holder


def list_holders(
    client: Connection | HasConnection, pattern: str | None = None
) -> list[dict[str, Any]]:
    """Every permit held under the client's prefix whose semaphore name matches the glob
    ``pattern`` (None: all), decoded (see :func:`holders_of`)."""
    conn = connection_of(client)
    query = intervals.holder_match(conn.prefix, FAMILY)
    found = holders_of(read_query(conn, query).records, pattern)
    return [holder.as_dict() for holder in found]


__all__ = [
    "Permit",
    "PermitOps",
    "Semaphore",
    "SemaphoreMaker",
    "check_limit",
    "clear_holder",
    "holders_of",
    "list_holders",
    "release_holder",
]
