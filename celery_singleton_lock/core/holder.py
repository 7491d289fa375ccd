"""A holder's hash, for every kind: the fields a handle stores about its holder
(:func:`holder_fields`, ``owner_info`` packed by :func:`info_fields`), and the typed record
a listing decodes such a hash into (:class:`ListedHolder`), which the admin reads
(``admin.inspect.lock_info``).

A lease and each name of a multi-key lock are held in the name's ``P{T}:lock`` hash, each
hold of an interval lock in its ``B h:<owner>``; the acquire scripts write these fields. A
lease's hash (lua/acquire.lua) keeps the fields that describe its holder as they were sent,
packed in one ``holder`` field, and has no ``renewed_ms`` until it is renewed: :func:`flatten`
reads such a hash with each of them a field of its own.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from dataclasses import dataclass
from typing import Any

from .keys import encode_name
from .pid_evidence import this_process_text

HOSTNAME = socket.gethostname()

#: Keys of ``owner_info`` stored as fields of their own (admin columns, lookups by task);
#: the rest is stored as one JSON field, ``info``.
OWN_INFO_FIELDS = ("task_name", "task_id", "worker", "attempt", "send")


def holder_fields(handle: Any, *, pid: int, thread: str, named: bool = True) -> list[Any]:
    """Field, value pairs the scripts store about the holder of ``handle`` (its ``name``,
    ``kind``, ``heartbeat`` and ``owner_info``), running in ``pid`` on ``thread``; without
    ``name`` when ``named`` is false. Shared by the sync and the asyncio handles."""
    fields: list[Any] = [b"name", encode_name(handle.name)] if named else []
    fields += [
        b"kind", handle.kind,
        b"host", HOSTNAME,
        b"pid", pid,
        b"thread", thread,
        # Whether a renewal age means anything to the admin listing.
        b"heartbeat", 1 if handle.heartbeat else 0,
    ]  # fmt: skip
    # Where and when ``pid`` names this process (core/pid_evidence.py): without it the pid
    # proves nothing about the holder. None where no mark can be made (not Linux).
    proc = this_process_text()
    if proc is not None:
        fields += (b"proc", proc)
    return fields + info_fields(handle.owner_info)


def info_fields(owner_info: dict[str, str]) -> list[Any]:
    """Field, value pairs that store ``owner_info`` on a holder record: the keys the admin
    view reads as fields of their own (``OWN_INFO_FIELDS``), the rest as one JSON ``info``
    field, so no key of it can overwrite a field the scripts rely on (``owner``, ``token``)."""
    fields: list[Any] = []
    for key in OWN_INFO_FIELDS:
        if key in owner_info:
            fields += (key, owner_info[key])
    # On a template's lease this runs on every acquire: the rest is looked for only when
    # there is some (the Celery layer's owner_info has none).
    if len(fields) < 2 * len(owner_info):
        extra = {key: value for key, value in owner_info.items() if key not in OWN_INFO_FIELDS}
        fields += (b"info", json.dumps(extra, sort_keys=True))
    return fields


#: The field of a holder hash holding the packed holder fields (``pack_holder``'s bytes).
PACKED_FIELD = b"holder"


def flatten(fields: dict[bytes, Any]) -> dict[bytes, Any]:
    """A holder hash as read (HGETALL) with its packed ``holder`` field unpacked into fields
    of their own (a field the hash has itself wins: handover.lua and renewals write those
    later), and ``renewed_ms`` as ``acquired_ms`` when it was not renewed yet. A hash
    without a ``holder`` field comes back as it is (but for ``renewed_ms``); one whose
    ``holder`` does not unpack keeps it, so a listing still shows the hold."""
    flat = fields
    packed = fields.get(PACKED_FIELD)
    if packed is not None:
        try:
            items = unpack_strings(packed)
        except ValueError:
            return fields
        flat = dict(zip(items[::2], items[1::2], strict=False))
        flat.update((key, value) for key, value in fields.items() if key != PACKED_FIELD)
    if b"renewed_ms" not in flat and b"acquired_ms" in flat:
        flat = {**flat, b"renewed_ms": flat[b"acquired_ms"]}
    return flat


def unpack_strings(raw: Any) -> list[bytes]:
    """The items of a MessagePack array of strings (what ``core.scripts.pack_holder``
    makes: fixarray, array 16 or 32 of fixstr, str 8/16/32, or bin 8/16/32); ValueError for
    anything else, or bytes left over."""
    if not isinstance(raw, bytes):
        raise ValueError("a packed holder is bytes")
    size, pos = _header(raw, 0, _ARRAY_HEADERS)
    items: list[bytes] = []
    for _ in range(size):
        length, pos = _header(raw, pos, _STR_HEADERS)
        if pos + length > len(raw):
            raise ValueError("a packed holder item runs past its end")
        items.append(raw[pos : pos + length])
        pos += length
    if pos != len(raw):
        raise ValueError("bytes after a packed holder")
    return items


#: MessagePack headers of arrays and of strings (and bins): first byte -> bytes of length
#: that follow it (big-endian); fix types carry the length in the byte itself.
_ARRAY_HEADERS = {0xDC: 2, 0xDD: 4}
_STR_HEADERS = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4}


def _header(raw: bytes, pos: int, sized: dict[int, int]) -> tuple[int, int]:
    """The length a MessagePack array or string header at ``pos`` gives, and where what it
    heads starts."""
    if pos >= len(raw):
        raise ValueError("a packed holder ends early")
    first = raw[pos]
    if sized is _ARRAY_HEADERS and 0x90 <= first <= 0x9F:
        return first & 0x0F, pos + 1
    if sized is _STR_HEADERS and 0xA0 <= first <= 0xBF:
        return first & 0x1F, pos + 1
    width = sized.get(first)
    if width is None or pos + 1 + width > len(raw):
        raise ValueError(f"not a packed holder (byte {first:#x} at {pos})")
    return int.from_bytes(raw[pos + 1 : pos + 1 + width], "big"), pos + 1 + width


@dataclass(frozen=True)
class ListedHolder:
    """One holder hash as a listing reads it; None where the hash has no such field (or one
    that does not read as its type). Times are server ms."""

    name: str
    #: ``lease``, ``multi``, ``range``; a reader-writer hold's mode (read, upgradable, write).
    kind: str
    owner: str | None = None
    token: int | None = None
    acquired_ms: int | None = None
    renewed_ms: int | None = None
    ttl_ms: int | None = None
    deadline_ms: int | None = None
    #: The key's PTTL when it was read (< 0: no expiry).
    pttl_ms: int | None = None
    host: str | None = None
    pid: int | None = None
    #: Where and when ``pid`` names the holder: a ``pid_evidence.ProcessMark`` as stored.
    proc: str | None = None
    thread: str | None = None
    task_name: str | None = None
    task_id: str | None = None
    worker: str | None = None
    attempt: str | None = None
    #: The send id of the task message holding it (celery/sends.py), if it has one.
    send: str | None = None
    #: 1 if the holder is renewed by a heartbeat, 0 if not.
    heartbeat: int | None = None
    #: ``RELEASE_DELAY_STATE`` (core/keys.py) for a hold in a release delay.
    state: str | None = None
    #: An interval hold's mode (read, upgradable or write) and bounds.
    mode: str | None = None
    lo: float | str | None = None
    hi: float | str | None = None
    #: The rest of the holder's ``owner_info``, as stored: JSON.
    info: str | None = None
    #: A multi-key lock: how many names it holds.
    names: str | None = None
    #: A semaphore's permit: the limit of the call that took it.
    limit: int | None = None
    #: A shared hold's call identity (the ``call`` option), if it was given one.
    call: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields the hash has, by name (the kinds' ``list_holders``)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


#: Each optional field's annotation (a str: annotations are not evaluated here), which says
#: how its stored value is decoded.
_DECODED = {f.name: f.type for f in dataclasses.fields(ListedHolder) if f.default is None}


def decode(fields: dict[bytes, Any], pttl: int) -> ListedHolder:
    """The holder hash ``fields`` read with PTTL ``pttl``: numbers as int, bounds as float
    (as the text stored when it is none), text as str; a hash with no ``kind`` is a lease.
    The hash is read as :func:`flatten` makes it."""
    fields = flatten(fields)
    found: dict[str, Any] = {}
    for raw_key, raw in fields.items():
        key = text(raw_key)
        decoded = _DECODED.get(key)
        if decoded == "int | None":
            found[key] = opt_int(raw)
        elif decoded == "float | str | None":
            found[key] = _bound(text(raw))
        elif decoded == "str | None":
            found[key] = text(raw)
    return ListedHolder(
        name=text(fields.get(b"name", b"")),
        kind=text(fields.get(b"kind", b"lease")),
        **{**found, "pttl_ms": int(pttl)},
    )


def text(value: Any) -> str:
    """A stored value as str (names are stored with surrogates escaped)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogatepass")
    return str(value)


def opt_int(value: Any) -> int | None:
    """A stored number as int; None for nothing, an empty value or a non-number."""
    if value is None or value == b"" or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _bound(value: str) -> float | str:
    try:
        return float(value)
    except ValueError:
        return value
