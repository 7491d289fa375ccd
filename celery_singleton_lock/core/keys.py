"""Lock names -> Redis keys.

Layout for a lock named N under prefix P (default ``csl:``)::

    P{T}:lock     hash   the holder (owner token, fencing token, and host, pid, ... packed
                         in one field: core/holder.py);
                         expires with the lease; during a release delay it has no owner
                         and its ``state`` is RELEASE_DELAY_STATE
    P{T}:fence    string the last fencing token handed out; expires FENCE_TTL after it
                         (set again by every token)
    P{T}:chan     pub/sub channel that wakes waiters on release (not a key)
    P{T}:queue    list   owner tokens of fair waiters, oldest first; expires unless one of
                         them refreshes it
    P{T}:w:<o>    hash   fair waiter o's registration (ttl, max-hold, holder fields); expires
                         unless o refreshes it
    P{T}:m:<o>    list   where a release hands the lease to fair waiter o (its token)
    P{T}:freed    hash   the hash of the last lease a release freed (release.lua and
                         multi_release.lua rename P{T}:lock to it, so it keeps the time the
                         hold had left): what tells a release sent again after its reply
                         was lost that it was done
    P{T}:released string the same for the admin's calls that free a lease key: who freed
                         it (clear.lua, release_holder.lua), while that hold had time left
    P{T}:undo:<t> hash   a claim the acquisition with fencing token t took over, kept with
                         the claim's own expiry so that an acquire whose reply was lost can
                         put it back (acquire_undo.lua)

T is the *tag*: N itself when it is short and brace-free, else ``#`` + a SHA-256 of N.
The braces make T a Redis Cluster hash tag, so every key of one lock lives in one slot
and one Lua script may touch them all.
"""

from __future__ import annotations

import functools
import hashlib
from typing import NamedTuple

#: The ``state`` field of a holder hash in its release delay (written by the release scripts,
#: lua/release.lua, release_holder.lua, multi_release.lua, interval_release.lua, and read by
#: the renew and acquire scripts). Stored data, so it keeps its value: holds that workers
#: already left in Redis must still be recognised.
RELEASE_DELAY_STATE = "cooldown"

#: The ``state`` field of the hash of a reader-writer, range or semaphore hold its holder
#: released, or a clear freed (then with ``cleared=1``) (lua/rw_release.lua,
#: interval_release.lua): the hash stays, named by no lock, until its own expiry (what the
#: hold had left), so that the release or clear sent again after its reply was lost finds
#: it done. Listings and releases by task pass it by. Stored data.
RELEASED_STATE = "released"

#: The prefix every key gets unless configured otherwise.
DEFAULT_PREFIX = "csl:"

#: Names longer than this (in UTF-8 bytes) are hashed into the key.
MAX_PLAIN_NAME = 200

#: How long the fencing counter outlives a name's last token (ms; set again by every token).
#: Tokens follow the Redis server clock in microseconds, so they keep increasing after this
#: key expires; the counter guards acquisitions within one microsecond and a server clock
#: stepped back by less than this. Every name ever locked keeps its counter this long after
#: its last lock (about 250 bytes for a 60-character name: with a new lock name per task
#: call, 100 calls a second keep about 90 MB of counters), which is why it is an hour and
#: not a day (2 GB).
FENCE_TTL_MS = 3600 * 1000


def encode_name(name: str) -> bytes:
    """UTF-8 bytes of a lock name; lone surrogates survive (``surrogatepass``)."""
    return name.encode("utf-8", "surrogatepass")


def name_tag(name: str) -> bytes:
    """The part of every key of lock ``name`` that goes between the hash-tag braces."""
    raw = encode_name(name)
    plain = (
        len(raw) <= MAX_PLAIN_NAME
        and not raw.startswith(b"#")
        and b"{" not in raw
        and b"}" not in raw
        and _is_valid_utf8(raw)
    )
    if plain:
        return raw
    digest = hashlib.sha256(raw).hexdigest()
    return b"#" + digest[:40].encode()


def _is_valid_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class LockKeys(NamedTuple):
    """The Redis names one lock uses (a tuple: made for every handle, and cheap to make)."""

    lock: bytes
    fence: bytes
    channel: bytes

    @property
    def base(self) -> bytes:
        """What every key of the lock starts with (``P{T}:``)."""
        return key_base(self.lock)


def key_base(lock_key: bytes) -> bytes:
    """``P{T}:`` of the lock hash ``P{T}:lock``."""
    return lock_key[: -len(b"lock")]


def lock_keys(prefix: str, name: str) -> LockKeys:
    """Keys of the lock called ``name`` under ``prefix``. Cached for names of up to
    ``MAX_PLAIN_NAME`` characters (so the cache stays small), as a handle is made per use of
    a name (``with client.lease(name):``) and most programs use a few names again."""
    if len(name) <= MAX_PLAIN_NAME:
        return _cached_lock_keys(prefix, name)
    return _make_lock_keys(prefix, name)


def _make_lock_keys(prefix: str, name: str) -> LockKeys:
    base = prefix.encode() + b"{" + name_tag(name) + b"}:"
    return LockKeys(base + b"lock", base + b"fence", base + b"chan")


_cached_lock_keys = functools.lru_cache(maxsize=4096)(_make_lock_keys)


def lock_pattern(prefix: str) -> bytes:
    """SCAN pattern matching the holder hash of every lock under ``prefix``."""
    return escape_glob(prefix.encode()) + b"{*}:lock"


def escape_glob(raw: bytes) -> bytes:
    """``raw`` with SCAN's glob characters backslash-escaped, so it matches only itself."""
    return b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c]) for c in raw)
