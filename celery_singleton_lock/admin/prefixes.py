"""Which key prefixes hold this package's locks: what an empty listing looks for before it
says ``no locks``, since the likeliest cause is a prefix other than the one asked.

It reads a bounded number of keys (one SCAN without a pattern, stopped after ``max_keys``):
a listing that found nothing may be on a server with millions of other keys, and a hint is
not worth a full walk. Only keys with this package's layout count (core/keys.py: ``P{T}:lock``
and the interval families' ``P{T}:<family>:h:<owner>``, hashes, with no brace in ``P``).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, NamedTuple

from ..core.connection import Connection, HasConnection, connection_of
from ..core.scan import BATCH
from ..core.steps import Pipeline, Scan, Steps
from ..kinds import rangelock, rwlock, semaphore

#: Keys an empty listing reads at most while looking for other prefixes.
MAX_KEYS = 5000

_FAMILIES = b"|".join(re.escape(f) for f in (rwlock.FAMILY, rangelock.FAMILY, semaphore.FAMILY))
#: A holder hash's key: the prefix (group 1), the braced tag, then ``:lock`` or a family's
#: ``:<family>:h:<owner>``. Prefixes, tags and owner tokens have no braces (core/keys.py).
_HOLDER_KEY = re.compile(rb"([^{}]*)\{[^{}]*\}:(?:lock|(?:" + _FAMILIES + rb"):h:[^{}]*)", re.S)


class Prefixes(NamedTuple):
    """What :func:`find_prefixes` saw: holder keys by prefix (most first), how many keys it
    read, and whether it stopped at its bound (then more prefixes may exist)."""

    found: list[tuple[str, int]]
    scanned: int
    capped: bool


def find_prefixes(source: Connection | HasConnection, *, max_keys: int = MAX_KEYS) -> Prefixes:
    """The prefixes under which this package's holder hashes are, among the first
    ``max_keys`` keys a SCAN returns (``found`` includes the client's own prefix only if
    keys are there, such as holds a listing does not show)."""
    return connection_of(source).run(prefixes_found(max_keys))


def prefixes_found(max_keys: int) -> Steps[Prefixes]:
    """:func:`find_prefixes`'s steps."""
    scanned_keys = yield Scan(None, BATCH, max_keys)
    scanned = len(scanned_keys)
    candidates: dict[bytes, str] = {}  # each key with a holder key's shape: its prefix
    for key in scanned_keys:
        shape = _HOLDER_KEY.fullmatch(key)
        if shape is not None:
            candidates[key] = shape.group(1).decode(errors="replace")
    keys = list(candidates)
    # The layout's names could be another program's strings or lists: only hashes count.
    types: list[Any] = []
    for start in range(0, len(keys), BATCH):
        types += yield Pipeline([("type", key) for key in keys[start : start + BATCH]])
    hashes = [key for key, kind in zip(keys, types, strict=True) if kind in (b"hash", "hash")]
    tally = Counter(candidates[key] for key in hashes)
    found = sorted(tally.items(), key=lambda item: (-item[1], item[0]))
    return Prefixes(found, scanned, scanned >= max_keys)
