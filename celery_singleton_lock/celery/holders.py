"""Who stands in a task's way: the holders of the lock a run or a call could not take, read
after the fact for the skip message, the skipped result and deduplication.

Only read on the conflict path (never on an uncontended acquire or release), so it may take a
round trip or two. A holder that let go in between simply is not listed. Each holder is the
:class:`HolderRecord` the handle lists; what the task layer reads in one (a claim? its
description) is here.
"""

from __future__ import annotations

import datetime

from ..core.handle import HolderRecord, LockHandle
from ..exceptions import LockBackendError
from ..kinds.lease import CLAIM_OWNER_PREFIX


def claimed(holder: HolderRecord) -> bool:
    """Whether ``holder`` holds for a queued message (enqueue-time lock, retry), not a running
    process."""
    return bool(holder.owner) and str(holder.owner).startswith(CLAIM_OWNER_PREFIX)


def describe_holder(holder: HolderRecord) -> str:
    """``task <id>``, ``queued task <id>``, ``a waiting writer`` or ``in a release delay until
    <UTC time>``."""
    if holder.release_delay_until_ms is not None:
        until = datetime.datetime.fromtimestamp(
            holder.release_delay_until_ms / 1000, tz=datetime.timezone.utc
        )
        return f"in a release delay until {until.isoformat(timespec='seconds')}"
    if holder.waiting:
        return "a waiting writer"
    who = f"task {holder.task_id}" if holder.task_id else "a holder with no task id"
    return f"queued {who}" if claimed(holder) else who


def describe(holders: list[HolderRecord]) -> str:
    """Why a lock with these ``holders`` (as :func:`holders_of` returned them) is taken:
    ``held by task <id>, ...`` or ``in a release delay until <UTC time>``."""
    if not holders:
        return "held by a holder that has let go since"
    held = [describe_holder(holder) for holder in holders if holder.release_delay_until_ms is None]
    delays = [
        describe_holder(holder) for holder in holders if holder.release_delay_until_ms is not None
    ]
    return ", ".join(([f"held by {', '.join(held)}"] if held else []) + delays)


def holder_task_id(holders: list[HolderRecord]) -> str | None:
    """The task id of the first holder that is a task (queued or running), if any: not the
    finished run a release delay was left by, nor a waiting writer."""
    for holder in holders:
        if holder.task_id and holder.release_delay_until_ms is None and not holder.waiting:
            return holder.task_id
    return None


def holders_of(handle: LockHandle) -> list[HolderRecord]:
    """The current holders of what ``handle`` could not take (an exclusive lease, each name of
    a multi-key lock, or every hold of a reader-writer / range lock), in no set order.
    Empty when Redis did not answer."""
    try:
        return handle.holders()
    except LockBackendError:
        return []
