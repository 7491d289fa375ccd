"""A holder's hash, for every kind: the fields a handle stores about its holder
(:func:`holder_fields`, ``owner_info`` packed by :func:`info_fields`), and the typed record
a listing decodes such a hash into (:class:`ListedHolder`), which the admin reads
(``admin.inspect.lock_info``).

A lease and each name of a multi-key lock are held in the name's ``P{T}:lock`` hash, each
hold of an interval lock in its ``B h:<owner>``; the acquire scripts write these fields.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from dataclasses import dataclass
from typing import Any

from .keys import encode_name

HOSTNAME = socket.gethostname()

#: Keys of ``owner_info`` stored as fields of their own (admin columns, lookups by task);
#: the rest is stored as one JSON field, ``info``.
OWN_INFO_FIELDS = ("task_name", "task_id", "worker", "attempt")


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
    thread: str | None = None
    task_name: str | None = None
    task_id: str | None = None
    worker: str | None = None
    attempt: str | None = None
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

    def as_dict(self) -> dict[str, Any]:
        """The fields the hash has, by name (the kinds' ``list_holders``)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


#: Each optional field's annotation (a str: annotations are not evaluated here), which says
#: how its stored value is decoded.
_DECODED = {f.name: f.type for f in dataclasses.fields(ListedHolder) if f.default is None}


def decode(fields: dict[bytes, Any], pttl: int) -> ListedHolder:
    """The holder hash ``fields`` read with PTTL ``pttl``: numbers as int, bounds as float
    (as the text stored when it is none), text as str; a hash with no ``kind`` is a lease."""
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
