"""Listing keys: one SCAN function and one batched reader for every lock kind's holders.

A listing reads hashes; a key of another type that its SCAN pattern matches is skipped and
counted (:class:`Read`), never the end of the listing: the keys a pattern matches are not all
ours to vouch for (another program's under the same prefix, an earlier release's).

On a Redis Cluster client ``scan_iter`` walks every primary, so a listing sees the keys of
every node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from redis.exceptions import ResponseError

from .holder import flatten
from .steps import Pipeline, Scan, Steps

if TYPE_CHECKING:
    from .connection import Connection

#: Keys asked for per SCAN page, and read per pipeline round trip.
BATCH = 500

#: One key as read by :func:`hashes_read`: its fields and its PTTL (ms; < 0: no expiry).
Record = tuple[dict[bytes, Any], int]

#: The keys a listing reads: exactly these keys, or every key matching this SCAN glob.
KeyQuery = list[bytes] | bytes


def scanned(match: bytes) -> Steps[list[bytes]]:
    """Every key matching the glob ``match``, each once (SCAN may return a key twice)."""
    found = yield Scan(match, BATCH)
    return list(dict.fromkeys(found))


class Read(NamedTuple):
    """What a listing read: the records of the keys that hold hashes, and how many keys it
    met that hold another type (skipped, not failed on: a foreign key matching its pattern,
    such as one a process of an earlier release built from a task id)."""

    records: list[Record]
    skipped: int = 0


def read_query(conn: Connection, query: KeyQuery) -> Read:
    """:func:`query_read` on a sync connection."""
    return conn.run(query_read(query))


def query_read(query: KeyQuery) -> Steps[Read]:
    """:func:`hashes_read` of the keys ``query`` names: its list, or the keys a SCAN of its
    glob finds."""
    keys = query if isinstance(query, list) else (yield from scanned(query))
    return (yield from hashes_read(keys))


def hashes_read(keys: list[bytes]) -> Steps[Read]:
    """HGETALL and PTTL of each of ``keys``, ``BATCH`` keys per pipeline round trip, in
    order, as :func:`records_of` reads them (an error reply kept in its place rather than
    raised, so one key of another type does not fail the page)."""
    read = Read([])
    for start in range(0, len(keys), BATCH):
        page = keys[start : start + BATCH]
        commands = [command for key in page for command in (("hgetall", key), ("pttl", key))]
        read = joined(read, records_of((yield Pipeline(commands, keep_errors=True))))
    return read


def records_of(replies: list[Any]) -> Read:
    """The records in the replies of a :func:`hashes_read` pipeline, the keys gone left out,
    each hash with its packed holder fields unpacked (:func:`.holder.flatten`), so readers
    see the fields of every layout alike. A key of another type than a hash (its HGETALL
    answered WRONGTYPE) is left out and counted; any other error reply is raised."""
    records: list[Record] = []
    skipped = 0
    for fields, pttl in zip(replies[::2], replies[1::2], strict=True):
        for reply in (fields, pttl):
            if isinstance(reply, Exception) and not wrong_type(reply):
                raise reply
        if wrong_type(fields):
            skipped += 1
        elif fields:
            records.append((flatten(fields), int(pttl)))
    return Read(records, skipped)


def wrong_type(reply: Any) -> bool:
    """Whether ``reply`` is Redis's WRONGTYPE error: the key holds another type."""
    return isinstance(reply, ResponseError) and str(reply).startswith("WRONGTYPE")


def joined(first: Read, second: Read) -> Read:
    """Two reads as one."""
    return Read(first.records + second.records, first.skipped + second.skipped)
