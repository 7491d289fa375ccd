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
    conn = connection_of(source)
    redis = conn.redis
    candidates, scanned = conn.call(lambda: _scan(redis, max_keys))
    if not candidates:
        return Prefixes([], scanned, scanned >= max_keys)
    keys = list(candidates)
    # The layout's names could be another program's strings or lists: only hashes count.
    types = conn.call(lambda: _types(redis, keys))
    tally = Counter(candidates[key] for key, kind in zip(keys, types, strict=True) if kind)
    found = sorted(tally.items(), key=lambda item: (-item[1], item[0]))
    return Prefixes(found, scanned, scanned >= max_keys)


def _scan(redis: Any, max_keys: int) -> tuple[dict[bytes, str], int]:
    """The keys with a holder key's shape among the first ``max_keys`` SCAN returns (with
    their prefix), and how many keys it read."""
    candidates: dict[bytes, str] = {}
    scanned = 0
    for key in redis.scan_iter(count=BATCH):
        scanned += 1
        shape = _HOLDER_KEY.fullmatch(key)
        if shape is not None:
            candidates[key] = shape.group(1).decode(errors="replace")
        if scanned >= max_keys:
            break
    return candidates, scanned


def _types(redis: Any, keys: list[bytes]) -> list[bool]:
    """Whether each of ``keys`` is a hash (one pipeline round trip per ``BATCH`` keys)."""
    hashes: list[bool] = []
    for start in range(0, len(keys), BATCH):
        pipe = redis.pipeline(transaction=False)
        for key in keys[start : start + BATCH]:
            pipe.type(key)
        hashes.extend(kind in (b"hash", "hash") for kind in pipe.execute())
    return hashes
