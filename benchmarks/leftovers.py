"""The keys a finished lock use left in Redis: found, weighed, aged and named by kind.

Used by the ``memory`` section: right after a use ends, every key matching the use's pattern
is read (``MEMORY USAGE ... SAMPLES 0``, ``PTTL``) and then deleted, so that the next use
finds only its own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from celery_singleton_lock.core.keys import escape_glob

#: Kinds of our keys by what follows the hash tag (``P{T}:``), longest first; see the key
#: layout tables of docs/lease.md and docs/locks.md.
OUR_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("rw:h:", "release trace"),  # a released hold's hash, kept for its lease's rest
    ("range:h:", "release trace"),
    ("sem:h:", "release trace"),
    ("rw:waiting", "waiters' mark"),
    ("range:waiting", "waiters' mark"),
    ("sem:waiting", "waiters' mark"),
    ("rw:", "lock index"),  # exp, wq: the lock's own hash or sorted sets
    ("range:", "lock index"),
    ("sem:", "lock index"),
    ("waiting:", "waiting mark"),
    ("done:", "done mark"),
    ("undo:", "undo record"),
    ("fence", "fencing counter"),
    ("freed", "release trace"),
    ("released", "clear trace"),
    ("lock", "lock hash (still held)"),
    ("queue", "fair queue"),
    ("w:", "fair waiter"),
    ("m:", "fair hand-off"),
)


def kind_of(key: str) -> str:
    """What ``key`` is, by its name: ours by the suffix after the hash tag, the other
    libraries' by their own naming."""
    _, tag_end, suffix = key.rpartition("}:")
    if tag_end:
        for start, kind in OUR_SUFFIXES:
            if suffix.startswith(start):
                return kind
        return "unknown (ours)"
    if key.startswith("lock-signal:"):
        return "signal list"  # python-redis-lock's wake-up list
    if "celery-task-meta-" in key:
        return "task result"
    return "lock key"


@dataclass(frozen=True)
class KeyLeft:
    """One key a use left: its name and kind, its size and how long it still lives."""

    name: str
    kind: str
    bytes: int
    #: Seconds it lives on after the use ended; ``math.inf``: it has no expiry.
    left_s: float

    @property
    def byte_seconds(self) -> float:
        return self.bytes * self.left_s


def weigh(client: redis.Redis, pattern: str, ended: float) -> list[KeyLeft]:
    """Every key matching ``pattern`` (a SCAN glob), weighed and aged, then deleted.

    ``ended``: ``time.monotonic()`` when the use ended; the time between it and the PTTL
    reply is added back, so a key's life is counted from the use's end (the reply's own
    transit, well under a millisecond, is not).
    """
    keys = list(client.scan_iter(match=pattern, count=1000))
    if not keys:
        return []
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)
        pipe.pttl(key)
    replies = pipe.execute()
    aged = time.monotonic() - ended
    left: list[KeyLeft] = []
    for i, key in enumerate(keys):
        size, pttl = replies[2 * i], replies[2 * i + 1]
        if size is None or pttl == -2:
            continue  # expired between the SCAN and the read
        name = key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else key
        seconds = math.inf if pttl == -1 else pttl / 1000 + aged
        left.append(KeyLeft(name, kind_of(name), int(size), seconds))
    client.unlink(*keys)
    return left


def glob(literal: str) -> str:
    """``literal`` with SCAN's glob characters escaped, to build a pattern from."""
    return escape_glob(literal.encode()).decode()


def no_expiry(uses: Sequence[Sequence[KeyLeft]]) -> int:
    """How many of the keys left by ``uses`` never expire."""
    return sum(1 for use in uses for key in use if math.isinf(key.left_s))
