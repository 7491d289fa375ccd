"""Listing keys: one SCAN function and one batched reader for every lock kind's holders.

On a Redis Cluster client ``scan_iter`` walks every primary, so a listing sees the keys of
every node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .holder import flatten

if TYPE_CHECKING:
    from .connection import Connection

#: Keys asked for per SCAN page, and read per pipeline round trip.
BATCH = 500

#: One key as read by :func:`read_hashes`: its fields and its PTTL (ms; < 0: no expiry).
Record = tuple[dict[bytes, Any], int]

#: The keys a listing reads: exactly these keys, or every key matching this SCAN glob.
KeyQuery = list[bytes] | bytes


def scan(conn: Connection, match: bytes) -> list[bytes]:
    """Every key matching the glob ``match``, each once (SCAN may return a key twice)."""
    redis = conn.redis
    found = conn.call(lambda: list(redis.scan_iter(match=match, count=BATCH)))
    return list(dict.fromkeys(found))


def read_query(conn: Connection, query: KeyQuery) -> list[Record]:
    """:func:`read_hashes` of the keys ``query`` names: its list, or the keys a SCAN of its
    glob finds."""
    return read_hashes(conn, query if isinstance(query, list) else scan(conn, query))


def read_hashes(conn: Connection, keys: list[bytes]) -> list[Record]:
    """HGETALL and PTTL of each of ``keys``, ``BATCH`` keys per pipeline round trip, in
    order, as :func:`records_of` reads them."""
    records: list[Record] = []
    for start in range(0, len(keys), BATCH):
        records += records_of(conn.call(reading(conn.redis, keys[start : start + BATCH]).execute))
    return records


def reading(redis: Any, keys: list[bytes]) -> Any:
    """A pipeline of ``redis`` (sync or asyncio) reading the HGETALL and PTTL of ``keys``."""
    pipe = redis.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
        pipe.pttl(key)
    return pipe


def records_of(replies: list[Any]) -> list[Record]:
    """The records in the replies of a :func:`reading` pipeline, the keys gone left out,
    each hash with its packed holder fields unpacked (:func:`.holder.flatten`), so readers
    see the fields of every layout alike."""
    return [
        (flatten(fields), int(pttl))
        for fields, pttl in zip(replies[::2], replies[1::2], strict=True)
        if fields
    ]
