"""Listing leases: who holds a lease key (a lease, one name of a multi-key lock, or the
release delay any holder left there), for a handle's conflict path and for the admin, and the
clear script call of a listed holder. The lease handle itself is in :mod:`.lease`."""

from __future__ import annotations

from fnmatch import fnmatchcase

from ..core.connection import Connection, HasConnection, connection_of
from ..core.handle import HolderRecord
from ..core.holder import ListedHolder, decode, text
from ..core.keys import RELEASE_DELAY_STATE, lock_keys, lock_pattern
from ..core.patterns import literal_name
from ..core.scan import KeyQuery, Record, hashes_read, read_query
from ..core.scripts import ScriptCall, ScriptHost
from ..core.steps import Steps, server_ms


def lease_holders_read(keys: list[bytes]) -> Steps[list[HolderRecord]]:
    """The holders of lease keys ``keys`` (a lease's, or each name of a multi-key lock):
    one pipelined read (:func:`hashes_read`), and a TIME only when a release delay needs its
    end on the server clock (a Cluster pipeline refuses TIME)."""
    found: list[tuple[str | None, str | None, int | None, str | None]] = []
    for fields, pttl in (yield from hashes_read(keys)).records:
        owner, task_id, state, send = (
            fields.get(field) for field in (b"owner", b"task_id", b"state", b"send")
        )
        if owner is None and task_id is None:
            continue  # this name is free now
        delayed = not owner and state == RELEASE_DELAY_STATE.encode()
        found.append(
            (
                text(owner) if owner else None,
                None if task_id is None else text(task_id),
                max(0, pttl) if delayed else None,
                None if send is None else text(send),
            )
        )
    delays = any(left is not None for _, _, left, _ in found)
    now_ms = (yield from server_ms()) if delays else 0
    holders: list[HolderRecord] = []
    for owner, task_id, left, send in found:
        until = None if left is None else now_ms + left
        holder = HolderRecord(owner=owner, task_id=task_id, release_delay_until_ms=until, send=send)
        if holder not in holders:
            holders.append(holder)
    return holders


def lease_keys(prefix: str, pattern: str | None) -> KeyQuery:
    """The lease keys (``P{T}:lock``) a listing of ``pattern`` reads: every one under the
    prefix (a SCAN), or only the key of the one name a literal ``pattern`` spells. Multi-key
    locks hold their names in these keys too."""
    name = None if pattern is None else literal_name(pattern)
    if name is not None:
        return [lock_keys(prefix, name).lock]
    return lock_pattern(prefix)


def lease_holders(records: list[Record], pattern: str | None = None) -> list[ListedHolder]:
    """The lease holders among lease ``records`` (and every release delay left on a lease key,
    whoever left it) whose name matches the glob ``pattern``, decoded."""
    holders: list[ListedHolder] = []
    for fields, pttl in records:
        holder = decode(fields, pttl)
        delayed = not holder.owner and holder.state == RELEASE_DELAY_STATE
        if holder.kind != "lease" and not delayed:
            continue  # a name held by a multi-key lock: multi.py lists its holders
        if pattern is None or fnmatchcase(holder.name, pattern):
            holders.append(holder)
    return holders


def list_holders(
    client: Connection | HasConnection, pattern: str | None = None
) -> list[ListedHolder]:
    """Every lease holder under the client's prefix whose name matches the glob ``pattern``
    (None: all); see :func:`lease_holders`."""
    conn = connection_of(client)
    return lease_holders(read_query(conn, lease_keys(conn.prefix, pattern)).records, pattern)


def clear_call(conn: ScriptHost, holder: ListedHolder) -> ScriptCall:
    """The deletion of a listed lease (or one name of a multi-key lock, or the release delay
    any holder left on a lease key) if it still carries the listed fencing token and, when
    the holder dict has a ``renewed_ms``, was not renewed since (release.lua, as a clear):
    a Reply: DONE cleared, GONE, TAKEN by another holder, RESUMED renewed since."""
    keys = lock_keys(conn.prefix, holder.name)
    token, renewed = holder.token, holder.renewed_ms
    return conn.scripts.clear_call(
        keys.lock, "" if token is None else str(token), "" if renewed is None else str(renewed)
    )
