"""Three-phase reader-writer locks: read, upgradable and write.

Read is compatible with read and upgradable; upgradable with read only (one upgradable at a
time); write with nothing (database S/U/X locks). Writers are preferred: once a writer waits,
its short, renewed reservation makes new readers and upgradables wait, so a reader stream
cannot starve it, and the readers it held back all get in together when it leaves (every
waiter of the channel is woken). Each reader is its own entry with its own expiry: a crashed
reader frees its share within its lease, and there is no reader limit.

Built on the interval engine (:mod:`.intervals`): every hold covers [-inf, +inf]. Keys live
under ``P{T}:rw:`` (see intervals.py and lua/interval_common.lua).
"""

from __future__ import annotations

import math
from typing import Any

from ..core import validate
from ..core.connection import Connection, HasConnection, connection_of
from ..core.replies import IntervalReply
from ..exceptions import LockNotHeld
from . import intervals
from .intervals import RESERVATION_MS, IntervalHandle

FAMILY = b"rw"


class RWLockHandle(IntervalHandle):
    """One hold of a reader-writer lock: ``kind`` is ``read``, ``upgradable`` or ``write``.

    Lease-like (``acquire``, ``release``, ``extend``, ``check``, ``token``, context manager).
    An upgradable hold can :meth:`upgrade` to the writer and :meth:`downgrade` back.
    """

    _family = FAMILY

    def __init__(
        self, client: Connection | HasConnection, name: str, mode: str, **options: Any
    ) -> None:
        super().__init__(client, name, mode, -math.inf, math.inf, **options)
        self.kind = intervals.MODE_NAMES[mode]
        self._upgraded = False

    @property
    def upgraded(self) -> bool:
        """True while an upgradable hold is upgraded to the writer."""
        return self._upgraded

    def upgrade(self, wait: float | None = None) -> bool:
        """Become the writer without letting go; True once upgraded, False if ``wait``
        seconds (default: the handle's own) passed first. While it waits, new readers wait
        too; readers already in are waited for."""
        wait = self._begin_upgrade(wait)
        if self._upgraded:
            return True
        reserve = wait > 0

        def attempt() -> tuple[bool, int]:
            code, value = self._change("upgrade", reserve=RESERVATION_MS if reserve else 0)
            return self._upgrade_tried(code, value, reserve)

        done, _ = attempt()
        if not done and reserve:
            done, _ = self._wait_for(attempt, wait, self._withdraw)
        self._upgraded = done
        return done

    def downgrade(self) -> None:
        """Go back from writer to upgradable: readers may come in again at once."""
        if not self._upgraded:
            raise LockNotHeld(f"the hold on {self.name!r} is not upgraded", name=self.name)
        code, _ = self._change("downgrade")
        if code != IntervalReply.DONE:
            raise self._changed_lost("downgrade")
        self._upgraded = False

    def _withdraw(self) -> None:
        # The upgrade stopped waiting: drop its reservation (not the hold) and wake the
        # readers it held back.
        if self._mine():
            self._change("unreserve")

    def _took(self, owner: str, token: int, sent_at: float) -> None:
        self._upgraded = False
        super()._took(owner, token, sent_at)

    def release(self, delay: float = 0.0) -> None:  # noqa: D102 - as LockHandle.release
        super().release(delay)
        self._upgraded = False


class RWLock:
    """A reader-writer lock on one name; makes handles (not yet acquired).

    Options of every handle are those of :meth:`LockClient.lease`: ``ttl``, ``heartbeat``,
    ``max_hold``, ``wait``, ``owner_info``, ``on_lost``.
    """

    def __init__(self, client: Connection | HasConnection, name: str) -> None:
        self.name = validate.check_name(name)
        self._conn = connection_of(client)

    def read(self, **options: Any) -> RWLockHandle:
        """A shared hold: any number of readers, alongside at most one upgradable."""
        return RWLockHandle(self._conn, self.name, "r", **options)

    def upgradable(self, **options: Any) -> RWLockHandle:
        """A read hold that excludes other upgradables and can become the writer."""
        return RWLockHandle(self._conn, self.name, "u", **options)

    def write(self, **options: Any) -> RWLockHandle:
        """An exclusive hold; preferred over new readers while it waits."""
        return RWLockHandle(self._conn, self.name, "w", **options)

    def __repr__(self) -> str:
        return f"<RWLock {self.name!r}>"


#: Listing, clearing and releasing a dead task's holds of reader-writer locks (the admin side).
ADMIN = intervals.IntervalFamilyAdmin(FAMILY)
list_holders = ADMIN.list_holders
clear_holder = ADMIN.clear_holder
release_holder = ADMIN.release_holder


__all__ = ["RWLock", "RWLockHandle", "clear_holder", "list_holders", "release_holder"]
