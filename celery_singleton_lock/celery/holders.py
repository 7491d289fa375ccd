"""Who stands in a task's way: the holders of the lock a run or a call could not take, read
after the fact for the skip message, the skipped result and deduplication.

Only read on the conflict path (never on an uncontended acquire or release), so it may take a
round trip or two. A holder that let go in between simply is not listed.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from ..exceptions import LockBackendError
from ..handle import LockHandle
from ..intervals import IntervalHandle
from ..lease import Lease
from ..multi import MultiLease
from .claims import CLAIM_PREFIX

_FIELDS = ("owner", "task_id", "state")


@dataclass(frozen=True)
class Holder:
    """One holder of a lock name: a run, a queued message's claim, or a delay-after."""

    task_id: str | None
    owner: str | None
    #: Server time (ms) at which a delay-after ends; None when this is not a delay-after.
    cooldown_until_ms: int | None = None
    #: A writer that waits for its turn: it holds nothing yet but keeps new readers out.
    waiting: bool = False

    @property
    def claimed(self) -> bool:
        """Held for a queued message (enqueue-time lock, retry), not a running process."""
        return bool(self.owner) and str(self.owner).startswith(CLAIM_PREFIX)

    def describe(self) -> str:
        """``task <id>``, ``queued task <id>``, ``a waiting writer`` or ``cooling down until
        <UTC time>``."""
        if self.cooldown_until_ms is not None:
            until = datetime.datetime.fromtimestamp(
                self.cooldown_until_ms / 1000, tz=datetime.timezone.utc
            )
            return f"cooling down until {until.isoformat(timespec='seconds')}"
        if self.waiting:
            return "a waiting writer"
        who = f"task {self.task_id}" if self.task_id else "a holder with no task id"
        return f"queued {who}" if self.claimed else who


def describe(holders: list[Holder]) -> str:
    """Why a lock with these ``holders`` (as :func:`holders_of` returned them) is taken:
    ``held by task <id>, ...`` or ``cooling down until <UTC time>``."""
    if not holders:
        return "held by a holder that has let go since"
    held = [holder.describe() for holder in holders if holder.cooldown_until_ms is None]
    cooling = [holder.describe() for holder in holders if holder.cooldown_until_ms is not None]
    return ", ".join(([f"held by {', '.join(held)}"] if held else []) + cooling)


def holder_task_id(holders: list[Holder]) -> str | None:
    """The task id of the first holder that is a task (queued or running), if any: not the
    finished run a delay-after was left by, nor a waiting writer."""
    for holder in holders:
        if holder.task_id and holder.cooldown_until_ms is None and not holder.waiting:
            return holder.task_id
    return None


def holders_of(handle: LockHandle) -> list[Holder]:
    """The current holders of what ``handle`` could not take (an exclusive lease, each name of
    a multi-key lock, or every hold of a reader-writer / range lock), in no set order.
    Empty when Redis did not answer."""
    try:
        if isinstance(handle, Lease):
            return _lease_holders(handle, [handle._keys.lock])
        if isinstance(handle, MultiLease):
            return _lease_holders(handle, [keys.lock for keys in handle._keys])
        if isinstance(handle, IntervalHandle):
            return _interval_holders(handle)
    except LockBackendError:
        return []
    return []


def _lease_holders(handle: LockHandle, keys: list[bytes]) -> list[Holder]:
    client = handle._client

    def read() -> list[Any]:
        pipe = client.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, *_FIELDS)
            pipe.pttl(key)
        return list(pipe.execute())

    replies = client._call(read)
    found: list[tuple[str | None, str | None, int | None]] = []
    for fields, pttl in zip(replies[::2], replies[1::2], strict=True):
        owner, task_id, state = (_text(value) for value in fields)
        if owner is None and task_id is None:
            continue  # this name is free now
        cooling = not owner and state == "cooldown"
        found.append((task_id, owner or None, max(0, int(pttl)) if cooling else None))
    now_ms = 0
    if any(remaining is not None for _, _, remaining in found):
        # A TIME of its own, on the delay-after path only (a Cluster pipeline refuses TIME).
        now_ms = client.server_ms()
    holders: list[Holder] = []
    for task_id, owner, remaining in found:
        until = None if remaining is None else now_ms + remaining
        holder = Holder(task_id=task_id, owner=owner, cooldown_until_ms=until)
        if holder not in holders:
            holders.append(holder)
    return holders


def _interval_holders(handle: IntervalHandle) -> list[Holder]:
    client, keys = handle._client, handle._keys

    def read_owners() -> list[Any]:
        pipe = client.redis.pipeline(transaction=False)
        pipe.zrange(keys.indexes[0], 0, -1)  # every holder, by expiry
        pipe.zrange(keys.queue[2], 0, -1)  # waiting writers' reservations
        return list(pipe.execute())

    def read_task_ids(owners: list[bytes]) -> list[Any]:
        pipe = client.redis.pipeline(transaction=False)
        for owner in owners:
            pipe.hmget(keys.base + b"h:" + owner, "task_id")
        return list(pipe.execute())

    owners, writers = client._call(read_owners)
    replies = client._call(read_task_ids, owners) if owners else []
    holders = [
        Holder(task_id=_text(fields[0]), owner=_text(owner))
        for owner, fields in zip(owners, replies, strict=True)
    ]
    # A writer waiting for its turn holds new readers back without holding anything yet.
    holders += [Holder(task_id=None, owner=_text(owner), waiting=True) for owner in writers]
    return holders


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else str(value)
