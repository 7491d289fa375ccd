"""Key layout versions: a process refuses the keys of a prefix that another release of the
package lays out differently, rather than misreading or overlooking the holds they keep.

Every family of keys the package writes has a layout version (:data:`LAYOUTS`). They are
recorded once per prefix, in the hash ``P layout`` (outside every lock's hash tag, so no
listing's pattern matches it), by the first process that uses the prefix. A connection reads
them on its first lock operation (a handle's first script call, or an admin call: a clear,
``release_owner``, ``release_holder``; a listing only reads them), and again a day later
(:data:`RECHECK_S`), in the script that records them (lua/layout.lua): one round trip per
connection and day, none per acquire. If a version recorded for a family it writes is not
its own, the operation raises :class:`KeyLayoutError` naming both, and so does every later one
on that connection, until one finds them equal.

Like every key of the package, the record expires: each recording check sets its life to
:data:`LAYOUT_TTL_S` (30 days) from then. A prefix some process takes a lock under at least
once every 29 days keeps its record; one unused for a month loses it with its locks, and
the next process records its own versions afresh.

A release that changes a family's layout raises its version here, so its processes and those
of the release before it refuse each other's prefix instead of sharing its locks.
"""

from __future__ import annotations

from typing import Any

from ..exceptions import KeyLayoutError
from .replication import Replication
from .scripts import Script, ScriptCall, bound_to, register, source

#: The key layout version of each family of keys under a prefix (core/keys.py documents the
#: lease's and the Celery layer's; kinds/ the others'). A family not recorded yet under a
#: prefix is recorded with this version.
LAYOUTS: dict[str, int] = {
    # P{T}:lock and the keys beside it (fence, queue, freed, undo...); claims are leases.
    "lease": 1,
    # A multi-key lock's names: each its P{T}:lock hash, written by the multi scripts.
    "multi": 1,
    # P{T}:rw:... (lua/rw_common.lua)
    "rw": 1,
    # P{T}:range:... (lua/interval_common.lua)
    "range": 1,
    # P{T}:sem:... (the interval engine, lua/semaphore_acquire.lua)
    "semaphore": 1,
    # The Celery layer's P{T}:done:<i> and P{T}:waiting:<i>:<a> (core/keys.py)
    "task_marks": 1,
}

#: What the layout hash is called after the prefix.
LAYOUT_KEY = b"layout"
#: How long the layout hash lives after the last check that recorded: a prefix used at
#: least once in that time keeps it.
LAYOUT_TTL_S = 30 * 86_400
#: A connection checks the versions again (and so refreshes the record's life) on its first
#: lock operation this long after its last check: well inside :data:`LAYOUT_TTL_S`, and
#: one round trip a day.
RECHECK_S = 86_400.0

#: The script's arguments: each family and its version.
_ARGS = tuple(item for kind, version in LAYOUTS.items() for item in (kind, version))


def layout_key(prefix: str) -> bytes:
    """The key of the layout hash of ``prefix``."""
    return prefix.encode() + LAYOUT_KEY


class LayoutScript:
    """lua/layout.lua registered on one Redis client (no I/O). A read, as far as the locks
    go: it waits for no replica."""

    def __init__(self, redis: Any, replication: Replication | None = None) -> None:
        self.record = register(redis, source("layout"))


def layout_call(conn: Any, *, record: bool = True) -> ScriptCall:
    """The call that records :data:`LAYOUTS` under ``conn``'s prefix where nothing is
    recorded yet (only reads, without ``record``: a listing writes nothing), and replies what
    is recorded there (:func:`check_reply` reads it)."""
    script: Script = bound_to(conn, LayoutScript).record
    if not record:
        return script, (layout_key(conn.prefix),), ("",)
    return script, (layout_key(conn.prefix),), (LAYOUT_TTL_S * 1000, *_ARGS)


def check_reply(reply: Any, prefix: str, url: str) -> bool:
    """KeyLayoutError if the recorded versions ``reply`` (the script's) differ from
    :data:`LAYOUTS` for a family (the first such one is named); a family only the other
    release knows is none of this process's business. True if every family of
    :data:`LAYOUTS` is recorded (as it is after a call that records)."""
    recorded = dict(zip(reply[::2], reply[1::2], strict=True))
    complete = True
    for kind, version in LAYOUTS.items():
        raw = recorded.get(kind.encode())
        if raw is None:
            complete = False  # not recorded yet: only a read (a listing) meets that
            continue
        found = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        if found != str(version):
            raise KeyLayoutError(
                f"the {kind} keys under prefix {prefix!r} on Redis at {url} have key layout "
                f"version {found}; this process of celery-singleton-lock writes version "
                f"{version} and refuses them: a process of another release uses this prefix. "
                "Run one release per prefix, or give each release a prefix of its own",
                kind=kind,
                found=found,
                expected=str(version),
            )
    return complete
