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
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..core import validate
from ..core.connection import Connection, HasConnection, connection_of
from ..core.replies import IntervalReply
from ..core.steps import Steps
from ..exceptions import LockError, LockNotHeld, LockNotReplicated
from . import intervals
from .intervals import RESERVATION_MS, IntervalHandle, IntervalHold

FAMILY = b"rw"


class RWLockHold(IntervalHold):
    """One hold of a reader-writer lock (every hold covers [-inf, +inf]): the operations of
    the sync :class:`RWLockHandle` and the asyncio one, with the upgrade and downgrade of an
    upgradable hold."""

    _family = FAMILY
    _upgraded: bool

    def _set_mode(self, mode: str) -> None:
        self.kind = intervals.MODE_NAMES[mode]
        self._upgraded = False

    @property
    def upgraded(self) -> bool:
        """True while an upgradable hold is upgraded to the writer."""
        return self._upgraded

    def _upgrade(self, wait: float | None) -> Steps[bool]:
        """``upgrade``: True once upgraded, False if ``wait`` seconds passed first."""
        if self.mode != "u":
            kind = intervals.MODE_NAMES[self.mode]
            raise LockError(f"only an upgradable hold can upgrade ({kind})", name=self.name)
        wait = self.wait if wait is None else validate.check_wait(wait)
        if self._upgraded:
            return True
        reserve = wait > 0
        unreplicated: LockNotReplicated | None = None

        def attempt() -> Steps[tuple[bool, int]]:
            nonlocal unreplicated
            code, value, unreplicated = yield from self._change(
                "upgrade", reserve=RESERVATION_MS if reserve else 0
            )
            if code == IntervalReply.PARENT_GONE:
                raise self._changed_lost("upgrade")
            return code == IntervalReply.DONE, intervals.wait_hint(value, reserve)

        done, _ = yield from attempt()
        if not done and reserve:
            done, _ = yield from self._wait_for(attempt, wait, self._withdraw)
        self._upgraded = done
        if unreplicated is not None:
            raise unreplicated  # upgraded on the master: the handle is the writer
        return done

    def _downgrade(self) -> Steps[None]:
        """``downgrade``: back from writer to upgradable."""
        if not self._upgraded:
            raise LockNotHeld(f"the hold on {self.name!r} is not upgraded", name=self.name)
        code, _, unreplicated = yield from self._change("downgrade")
        if code != IntervalReply.DONE:
            raise self._changed_lost("downgrade")
        self._upgraded = False
        if unreplicated is not None:
            raise unreplicated

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
            self._upgraded = self._upgraded and self._mine()


class RWLockHandle(RWLockHold, IntervalHandle):
    """One hold of a reader-writer lock: ``kind`` is ``read``, ``upgradable`` or ``write``.

    Lease-like (``acquire``, ``release``, ``extend``, ``check``, ``token``, context manager).
    An upgradable hold can :meth:`upgrade` to the writer and :meth:`downgrade` back.
    """

    def __init__(
        self, client: Connection | HasConnection, name: str, mode: str, **options: Any
    ) -> None:
        super().__init__(client, name, mode, -math.inf, math.inf, **options)
        self._set_mode(mode)

    def upgrade(self, wait: float | None = None) -> bool:
        """Become the writer without letting go; True once upgraded, False if ``wait``
        seconds (default: the handle's own) passed first. While it waits, new readers wait
        too; readers already in are waited for."""
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
    ``max_hold``, ``wait``, ``owner_info``, ``on_lost``.
    """

    def __init__(self, client: Connection | HasConnection, name: str) -> None:
        super().__init__(name, connection_of(client), RWLockHandle)


#: Listing, clearing and releasing a dead task's holds of reader-writer locks (the admin side).
ADMIN = intervals.IntervalFamilyAdmin(FAMILY)
list_holders = ADMIN.list_holders
clear_holder = ADMIN.clear_holder
release_holder = ADMIN.release_holder


__all__ = [
    "RWLock",
    "RWLockHandle",
    "RWLockHold",
    "RWLockMaker",
    "clear_holder",
    "list_holders",
    "release_holder",
]
