"""Range locks: read, upgradable and write holds on closed real intervals [lo, hi].

Holds conflict only where their intervals overlap (touching endpoints overlap: intervals are
closed) in incompatible modes: read is compatible with read and upgradable, upgradable with
read only, write with nothing. ``±math.inf`` make open ends. A held range can be shrunk
without letting go (growing could deadlock, so it is refused); an upgradable range can take a
write hold on a sub-range of itself, which waits only for other owners' readers.

Waiting writers queue short reservations that overlapping new readers and upgradables
respect, as in the reader-writer lock, so a stream of readers cannot starve a writer.

Every operation is one script call of the interval engine (:mod:`.intervals`), O(log n) in
the n holds of the lock: overlap is counted with rank queries on sorted sets by lo and by hi,
not by scanning. Keys live under ``P{T}:range:`` (see intervals.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..core import validate
from ..core.connection import Connection, HasConnection, connection_of
from ..core.handle_ops import may_have_run
from ..core.replies import Reply
from ..core.steps import Steps
from ..exceptions import ConfigurationError, LockError
from . import intervals
from .intervals import IntervalHandle, IntervalOps, check_interval

FAMILY = b"range"


class RangeLockOps(IntervalOps):
    """A hold on [lo, hi] of a range lock: the operations of the sync
    :class:`RangeLockHandle` and the asyncio one, with the shrink and the nested write."""

    kind = "range"
    _family = FAMILY

    def _shrink(self, lo: float, hi: float) -> Steps[None]:
        """``shrink``: narrow the held interval to [lo, hi], inside the current one."""
        low, high = self._inside(lo, hi, "held")
        try:
            code, _, unreplicated = yield from self._change("shrink", low, high)
        except BaseException as exc:
            if may_have_run(exc):
                # The handle says it holds [lo, hi] only, which it holds either way, so that
                # nothing is done in the parts that may have been freed.
                self.lo, self.hi = low, high
            raise
        if code == Reply.NOT_INSIDE:  # pragma: no cover - the check above prevents it
            raise ConfigurationError("lo", f"[{lo}, {hi}] is not inside the held range")
        if code != Reply.DONE:
            raise self._changed_lost("shrink")
        self.lo, self.hi = low, high
        if unreplicated is not None:
            raise unreplicated

    def _nested_write(self, lo: object, hi: object) -> tuple[float, float]:
        """[lo, hi] of a write nested in this hold, checked (only in an upgradable one)."""
        if self.mode != "u":
            raise LockError("only an upgradable range can nest a write", name=self.name)
        return self._inside(lo, hi, "upgradable")

    def __repr__(self) -> str:
        state = "lost" if self.lost else "held" if self.held else "free"
        mode = intervals.MODE_NAMES[self.mode]
        return f"<{type(self).__name__} {self.name!r} {mode} [{self.lo}, {self.hi}] {state}>"


class RangeLockHandle(RangeLockOps, IntervalHandle):
    """A hold on [lo, hi] of a range lock; ``mode`` is 'r', 'u' or 'w'. Lease-like."""

    def shrink(self, lo: float, hi: float) -> None:
        """Narrow the held interval to [lo, hi] (inside the current one) without letting go;
        waiters on the freed parts are woken. A shrink that raised LockBackendError may have
        run: the handle then says it holds [lo, hi] (it holds at least that), and the same
        shrink can be sent again."""
        self._run(self._shrink(lo, hi))

    def write(self, lo: float, hi: float, **options: Any) -> RangeLockHandle:
        """A write hold (not yet acquired) on [lo, hi] inside this upgradable hold: it does
        not conflict with this hold, and waits for other owners' overlapping readers."""
        low, high = self._nested_write(lo, hi)
        return RangeLockHandle(self._conn, self.name, "w", low, high, parent=self, **options)


H = TypeVar("H")


class RangeLockMaker(Generic[H]):
    """A range lock on one name, making handles (not yet acquired) on closed intervals of
    one runner: :class:`RangeLock` and the asyncio ``AsyncRangeLock``."""

    def __init__(self, name: object, conn: Any, make: Callable[..., H]) -> None:
        self.name = validate.check_name(name)
        self._conn = conn
        self._make = make

    def read(self, lo: float, hi: float, **options: Any) -> H:
        """A shared hold on [lo, hi]."""
        return self._handle("r", lo, hi, options)

    def upgradable(self, lo: float, hi: float, **options: Any) -> H:
        """A read hold on [lo, hi] that excludes overlapping upgradables and writers and can
        nest write holds (:meth:`RangeLockHandle.write`)."""
        return self._handle("u", lo, hi, options)

    def write(self, lo: float, hi: float, **options: Any) -> H:
        """An exclusive hold on [lo, hi]."""
        return self._handle("w", lo, hi, options)

    def _handle(self, mode: str, lo: float, hi: float, options: dict[str, Any]) -> H:
        low, high = check_interval(lo, hi)
        return self._make(self._conn, self.name, mode, low, high, **options)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class RangeLock(RangeLockMaker[RangeLockHandle]):
    """A range lock on one name; makes handles (not yet acquired) on closed intervals.

    Options of every handle are those of :meth:`LockClient.lease`: ``ttl``, ``heartbeat``,
    ``max_hold``, ``wait``, ``owner_info``, ``on_lost``; and ``call``, the hold's call
    identity (see :func:`.intervals.check_call`).
    """

    def __init__(self, client: Connection | HasConnection, name: str) -> None:
        super().__init__(name, connection_of(client), RangeLockHandle)


#: Listing, clearing and releasing a dead task's holds of range locks (the admin side).
ADMIN = intervals.IntervalFamilyAdmin(FAMILY)
list_holders = ADMIN.list_holders
clear_holder = ADMIN.clear_holder
release_holder = ADMIN.release_holder


__all__ = [
    "RangeLockOps",
    "RangeLock",
    "RangeLockHandle",
    "RangeLockMaker",
    "clear_holder",
    "list_holders",
    "release_holder",
]
