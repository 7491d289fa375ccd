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

from typing import Any

from ..core import validate
from ..core.connection import Connection, HasConnection, connection_of
from ..core.replies import IntervalReply
from ..exceptions import ConfigurationError
from . import intervals
from .intervals import IntervalHandle, check_interval

FAMILY = b"range"


class RangeLockHandle(IntervalHandle):
    """A hold on [lo, hi] of a range lock; ``mode`` is 'r', 'u' or 'w'. Lease-like."""

    kind = "range"
    _family = FAMILY

    def shrink(self, lo: float, hi: float) -> None:
        """Narrow the held interval to [lo, hi] (inside the current one) without letting go;
        waiters on the freed parts are woken."""
        low, high = self._inside(lo, hi, "held")
        code, _ = self._change("shrink", low, high)
        if code == IntervalReply.NOT_INSIDE:  # pragma: no cover - the check above prevents it
            raise ConfigurationError("lo", f"[{lo}, {hi}] is not inside the held range")
        if code != IntervalReply.DONE:
            raise self._changed_lost("shrink")
        self.lo, self.hi = low, high

    def write(self, lo: float, hi: float, **options: Any) -> RangeLockHandle:
        """A write hold (not yet acquired) on [lo, hi] inside this upgradable hold: it does
        not conflict with this hold, and waits for other owners' overlapping readers."""
        low, high = self._nested_write(lo, hi)
        return RangeLockHandle(self._conn, self.name, "w", low, high, parent=self, **options)

    def __repr__(self) -> str:
        return describe_hold(self)


def describe_hold(handle: Any) -> str:
    """The repr of a range hold, sync or async: its mode and interval, then its state."""
    state = "lost" if handle.lost else "held" if handle.held else "free"
    mode = intervals.MODE_NAMES[handle.mode]
    return f"<{type(handle).__name__} {handle.name!r} {mode} [{handle.lo}, {handle.hi}] {state}>"


class RangeLock:
    """A range lock on one name; makes handles (not yet acquired) on closed intervals.

    Options of every handle are those of :meth:`LockClient.lease`: ``ttl``, ``heartbeat``,
    ``max_hold``, ``wait``, ``owner_info``, ``on_lost``.
    """

    def __init__(self, client: Connection | HasConnection, name: str) -> None:
        self.name = validate.check_name(name)
        self._conn = connection_of(client)

    def read(self, lo: float, hi: float, **options: Any) -> RangeLockHandle:
        """A shared hold on [lo, hi]."""
        return self._handle("r", lo, hi, options)

    def upgradable(self, lo: float, hi: float, **options: Any) -> RangeLockHandle:
        """A read hold on [lo, hi] that excludes overlapping upgradables and writers and can
        nest write holds (:meth:`RangeLockHandle.write`)."""
        return self._handle("u", lo, hi, options)

    def write(self, lo: float, hi: float, **options: Any) -> RangeLockHandle:
        """An exclusive hold on [lo, hi]."""
        return self._handle("w", lo, hi, options)

    def _handle(self, mode: str, lo: float, hi: float, options: dict[str, Any]) -> RangeLockHandle:
        low, high = check_interval(lo, hi)
        return RangeLockHandle(self._conn, self.name, mode, low, high, **options)

    def __repr__(self) -> str:
        return f"<RangeLock {self.name!r}>"


#: Listing, clearing and releasing a dead task's holds of range locks (the admin side).
ADMIN = intervals.IntervalFamilyAdmin(FAMILY)
list_holders = ADMIN.list_holders
clear_holder = ADMIN.clear_holder
release_holder = ADMIN.release_holder


__all__ = ["RangeLock", "RangeLockHandle", "clear_holder", "list_holders", "release_holder"]
