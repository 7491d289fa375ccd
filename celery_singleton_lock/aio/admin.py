"""The admin view for the async client: who holds what, and clearing safely.

The reading is done here with ``redis.asyncio``; what the records mean (states, evidence,
the :class:`..admin.LockInfo` fields) is decided by :func:`..admin.lock_info`, and clearing
runs the same holder-checked scripts as :mod:`..admin`, so both clients list and clear alike.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from ..admin import (
    BATCH,
    CLEARED,
    GONE,
    LIVE,
    QUEUED,
    RESUMED,
    LockInfo,
    escape,
    literal_name,
    lock_info,
)
from ..core.keys import lock_keys, lock_pattern
from ..exceptions import LockError
from ..kinds.intervals import interval_keys
from ..kinds.rangelock import FAMILY as RANGE_FAMILY
from ..kinds.rwlock import FAMILY as RW_FAMILY
from ..kinds.semaphore import FAMILY as SEMAPHORE_FAMILY
from ..kinds.semaphore import KIND as SEMAPHORE_KIND
from . import wire
from .connection import AsyncConnection, HasAsyncConnection, async_connection_of
from .intervals import release_hold

Holder = dict[str, Any]


async def _read(conn: AsyncConnection, keys: list[bytes]) -> list[tuple[dict[Any, Any], int]]:
    """HGETALL and PTTL of each key, ``BATCH`` keys per pipeline round trip."""
    found = []
    for start in range(0, len(keys), BATCH):
        pipe = conn.redis.pipeline(transaction=False)
        for key in keys[start : start + BATCH]:
            pipe.hgetall(key)
            pipe.pttl(key)
        replies = await conn.call(pipe.execute)
        found += [
            (fields, int(pttl)) for fields, pttl in zip(replies[::2], replies[1::2], strict=True)
        ]
    return [(fields, pttl) for fields, pttl in found if fields]


async def _scan(conn: AsyncConnection, match: bytes) -> list[bytes]:
    async def scan() -> list[bytes]:
        return [key async for key in conn.redis.scan_iter(match=match, count=BATCH)]

    return list(dict.fromkeys(await conn.call(scan)))  # SCAN may return a key twice


async def _lock_hash_holders(conn: AsyncConnection, pattern: str | None) -> list[Holder]:
    """Leases, delay-afters and multi-key names: every ``P{T}:lock`` hash."""
    name = None if pattern is None else literal_name(pattern)
    if name is not None:
        keys = [lock_keys(conn.prefix, name).lock]
    else:
        keys = await _scan(conn, lock_pattern(conn.prefix))
    holders: list[Holder] = []
    for fields, pttl in await _read(conn, keys):
        holder = wire.lock_hash_holder(fields, pttl)
        if holder is not None:
            holders.append(holder)
    return holders


async def _interval_holders(conn: AsyncConnection, family: bytes) -> list[Holder]:
    match = wire.interval_holder_pattern(conn.prefix, family)
    found = await _read(conn, await _scan(conn, match))
    return [wire.interval_holder(fields, pttl, family) for fields, pttl in found]


async def list_locks(
    client: AsyncConnection | HasAsyncConnection, pattern: str | None = None
) -> list[LockInfo]:
    """Every holder of every lock under the connection's prefix whose name matches the glob
    ``pattern``, as :func:`..admin.list_locks` lists them (without Celery's checks)."""
    conn = async_connection_of(client)
    now_ms = await conn.server_ms()
    holders = await _lock_hash_holders(conn, pattern)
    for family in (RW_FAMILY, RANGE_FAMILY, SEMAPHORE_FAMILY):
        holders += await _interval_holders(conn, family)
    infos = [lock_info(holder, now_ms) for holder in holders]
    infos = [info for info in infos if pattern is None or fnmatchcase(info.name, pattern)]
    return sorted(infos, key=lambda i: (i.name, i.kind, str(i.lo), i.token or 0))


async def clear_listed(
    client: AsyncConnection | HasAsyncConnection, info: LockInfo, *, force: bool = False
) -> int:
    """Clear the listed holder ``info`` in one atomic step that checks it is still that holder
    (its fencing token) and, unless ``force``, that a holder listed stale was not renewed since
    (see :func:`..admin.clear_listed`): CLEARED, GONE, TAKEN or RESUMED."""
    conn = async_connection_of(client)
    token, renewed = wire.clear_guards(info, force)
    if info.kind in ("lease", "multi"):
        # A multi-key lock holds each name in a lease's hash: cleared by its fencing token,
        # one name at a time.
        keys = lock_keys(conn.prefix, info.name)
        code = await conn.script(
            conn.lease_scripts.clear, (keys.lock,), (token, keys.channel, renewed)
        )
    elif info.kind in ("read", "write", "upgradable", "range"):
        family = RANGE_FAMILY if info.kind == "range" else RW_FAMILY
        ikeys = interval_keys(conn.prefix, info.name, family)
        code = await release_hold(conn, ikeys, info.owner or "", 0, token, renewed)
    elif info.kind == SEMAPHORE_KIND:
        # A permit is an interval hold of its own family.
        ikeys = interval_keys(conn.prefix, info.name, SEMAPHORE_FAMILY)
        code = await release_hold(conn, ikeys, info.owner or "", 0, token, renewed)
    else:
        return GONE
    return int(code)


async def clear_info(client: AsyncConnection | HasAsyncConnection, info: LockInfo) -> bool:
    """Clear the listed holder ``info`` if it still holds (token-checked, atomic)."""
    return await clear_listed(client, info) == CLEARED


async def clear(
    client: AsyncConnection | HasAsyncConnection,
    name: str,
    *,
    token: int | None = None,
    force: bool = False,
) -> bool:
    """Clear every holder of lock ``name`` (only the one with fencing ``token``, if given);
    refuses a live one without ``force``, and leaves alone a holder listed stale whose
    heartbeat resumed before the clear, saying so (see :func:`..admin.clear`)."""
    infos = [
        info
        for info in await list_locks(client, escape(name))
        if info.name == name and (token is None or info.token == token)
    ]
    live = [info for info in infos if info.state in (LIVE, QUEUED)]
    if live and not force:
        raise LockError(
            f"lock {name!r} is {live[0].state} ({live[0].evidence}); clear it with force=True",
            name=name,
        )
    codes = [await clear_listed(client, info, force=force) for info in infos]
    if RESUMED in codes:
        raise LockError(
            f"lock {name!r} left alone: heartbeat resumed since it was listed stale", name=name
        )
    return CLEARED in codes
