"""Who stands in a task's way: the holders of the lock a run or a call could not take, read
after the fact for the skip message, the skipped result and deduplication.

Only read on the conflict path (never on an uncontended acquire or release), so it may take a
round trip or two. A holder that let go in between simply is not listed.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from ..core.handle import LockHandle
from ..exceptions import LockBackendError
from ..kinds.lease import CLAIM_OWNER_PREFIX


@dataclass(frozen=True)
class Holder:
    """One holder of a lock name: a run, a queued message's claim, or a release delay."""

    task_id: str | None
    owner: str | None
    #: Server time (ms) at which a release delay ends; None when this is not a release delay.
    release_delay_until_ms: int | None = None
    #: A writer that waits for its turn: it holds nothing yet but keeps new readers out.
    waiting: bool = False
    #: The send id of the message holding it (sends.py), None if it has none.
    send: str | None = None

    @property
    def claimed(self) -> bool:
        """Held for a queued message (enqueue-time lock, retry), not a running process."""
        return bool(self.owner) and str(self.owner).startswith(CLAIM_OWNER_PREFIX)

    def describe(self) -> str:
        """``task <id>``, ``queued task <id>``, ``a waiting writer`` or ``in a release delay until
        <UTC time>``."""
        if self.release_delay_until_ms is not None:
            until = datetime.datetime.fromtimestamp(
                self.release_delay_until_ms / 1000, tz=datetime.timezone.utc
            )
            return f"in a release delay until {until.isoformat(timespec='seconds')}"
        if self.waiting:
            return "a waiting writer"
        who = f"task {self.task_id}" if self.task_id else "a holder with no task id"
        return f"queued {who}" if self.claimed else who


def describe(holders: list[Holder]) -> str:
    """Why a lock with these ``holders`` (as :func:`holders_of` returned them) is taken:
    ``held by task <id>, ...`` or ``in a release delay until <UTC time>``."""
    if not holders:
        return "held by a holder that has let go since"
    held = [holder.describe() for holder in holders if holder.release_delay_until_ms is None]
    delays = [holder.describe() for holder in holders if holder.release_delay_until_ms is not None]
    return ", ".join(([f"held by {', '.join(held)}"] if held else []) + delays)


def holder_task_id(holders: list[Holder]) -> str | None:
    """The task id of the first holder that is a task (queued or running), if any: not the
    finished run a release delay was left by, nor a waiting writer."""
    for holder in holders:
        if holder.task_id and holder.release_delay_until_ms is None and not holder.waiting:
            return holder.task_id
    return None


def holders_of(handle: LockHandle) -> list[Holder]:
    """The current holders of what ``handle`` could not take (an exclusive lease, each name of
    a multi-key lock, or every hold of a reader-writer / range lock), in no set order.
    Empty when Redis did not answer."""
    try:
        records = handle.holders()
    except LockBackendError:
        return []
    return [
        Holder(
            task_id=record.task_id,
            owner=record.owner,
            release_delay_until_ms=record.release_delay_until_ms,
            waiting=record.waiting,
            send=record.send,
        )
        for record in records
    ]
