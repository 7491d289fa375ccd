"""The admin view for the async client: who holds what, and clearing safely.

Each family of lock kinds says, in the kind registry (``kinds/registry.py``), which keys a
listing reads, how its holders are decoded and which script call clears one; the sync admin
(:mod:`..admin`) reads the same entries. Only the reading and the script runs are done here,
with ``redis.asyncio``; what the records mean is decided by :func:`..admin.lock_infos`.
"""

from __future__ import annotations

from typing import Any

from ..admin import BATCH, CLEARED, GONE, Listing, LockInfo, escape, listed
from ..admin.clear import clear_call, cleared, to_clear
from ..admin.inspect import lock_infos
from ..core import validate
from ..core.holder import ListedHolder
from ..core.replies import Reply
from ..core.scan import Read, executed, joined, reading, records_of
from ..kinds.registry import FAMILIES
from .connection import AsyncConnection, HasAsyncConnection, async_connection_of


async def _read(conn: AsyncConnection, keys: list[bytes]) -> Read:
    """HGETALL and PTTL of each key, ``BATCH`` keys per pipeline round trip, as
    :func:`..core.scan.read_hashes` reads them (a key of another type skipped, counted)."""
    read = Read([])
    for start in range(0, len(keys), BATCH):
        pipe = reading(conn.redis, keys[start : start + BATCH])

        async def page(pipe: Any = pipe) -> Read:
            return records_of(await executed(pipe))

        read = joined(read, await conn.call(page))
    return read


async def _scan(conn: AsyncConnection, match: bytes) -> list[bytes]:
    async def scan() -> list[bytes]:
        return [key async for key in conn.redis.scan_iter(match=match, count=BATCH)]

    return list(dict.fromkeys(await conn.call(scan)))  # SCAN may return a key twice


async def list_locks(
    client: AsyncConnection | HasAsyncConnection, pattern: str | None = None
) -> Listing:
    """Every holder of every lock under the connection's prefix whose name matches the glob
    ``pattern``, as :func:`..admin.list_locks` lists them (without Celery's checks), with
    the count of keys of another type skipped."""
    pattern = validate.check_pattern(pattern)
    conn = async_connection_of(client)
    await conn.check_layout(record=False)
    now_ms = await conn.server_ms()
    read: dict[str, Read] = {}  # keyspace -> what was read there: each is read once
    holders: list[ListedHolder] = []
    for family in FAMILIES:
        if family.keyspace not in read:
            query = family.keys(conn.prefix, pattern)
            keys = query if isinstance(query, list) else await _scan(conn, query)
            read[family.keyspace] = await _read(conn, keys)
        holders += family.holders(read[family.keyspace].records, pattern)
    skipped = sum(found.skipped for found in read.values())
    return listed(lock_infos(holders, now_ms, pattern), skipped, conn.prefix)


async def clear_listed(
    client: AsyncConnection | HasAsyncConnection, info: LockInfo, *, force: bool = False
) -> Reply:
    """Clear the listed holder ``info`` in one atomic step that checks it is still that holder
    (its fencing token) and, unless ``force``, that a holder listed stale was not renewed since
    (see :func:`..admin.clear_listed`): CLEARED, GONE, TAKEN or RESUMED."""
    conn = async_connection_of(client)
    call = clear_call(conn, info, force)
    if call is None:
        return GONE
    await conn.check_layout()
    return Reply(int(await conn.script(*call)))


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
    name = validate.check_name(name)
    token = validate.check_optional_token(token)
    force = validate.check_bool(force, "force")
    infos = to_clear(await list_locks(client, escape(name)), name, token, force)
    return cleared(name, [await clear_listed(client, info, force=force) for info in infos])
