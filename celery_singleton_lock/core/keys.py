"""Lock names -> Redis keys.

Layout for a lock named N under prefix P (default ``csl:``)::

    P{T}:lock     hash   the holder (owner token, fencing token, and host, pid, ... packed
                         in one field: core/holder.py);
                         expires with the lease; during a release delay it has no owner
                         and its ``state`` is RELEASE_DELAY_STATE
    P{T}:fence    string the last fencing token handed out; expires when the server
                         clock passes it (fencing.lua)
    P{T}:chan     pub/sub channel that wakes waiters on release (not a key)
    P{T}:queue    list   owner tokens of fair waiters, oldest first; expires unless one of
                         them refreshes it
    P{T}:w:<o>    hash   fair waiter o's registration (ttl, max-hold, holder fields); expires
                         unless o refreshes it
    P{T}:m:<o>    list   where a release hands the lease to fair waiter o (its token)
    P{T}:freed    hash   the trace of the last lease freed (lua/trace.lua), for the time
                         that hold had left: its owner and token after its holder's release
                         (release.lua, multi_release.lua), its token and `cleared` (who
                         freed it) after the admin's or a supervisor's (release.lua): what
                         tells a call sent again after its reply was lost that it was done
    P{T}:undo:<t> hash   a claim the acquisition with fencing token t took over, kept with
                         the claim's own expiry so that an acquire whose reply was lost can
                         put it back (acquire_undo.lua)

and the Celery layer's own, with i a task id as :func:`key_part` escapes it::

    P{T}:waiting:<i>:<a>  string  a delivery of attempt a of task i waits for the lock
                                  (celery/waiting_marks.py)
    P{T}:done:<i>         string  the highest attempt of task i that ended
                                  (celery/done_marks.py)

T is the *tag*: N itself when it is short and brace-free, else ``#`` + a SHA-256 of N.
The braces make T a Redis Cluster hash tag, so every key of one lock lives in one slot
and one Lua script may touch them all.

The one rule every key keeps: after the prefix, its only braces are the two around T. The
listings SCAN for ``P{*}:lock`` (:func:`lock_pattern`) and ``P{*}:<family>:h:*``
(kinds/intervals.py), whose ``*`` matches braces too, so a key with a ``}`` of its own after
T could match another kind's pattern (``P{T}:done:x}:lock`` is not a lock hash). Hence T
is hashed when N has a brace, owner tokens may not have one (core/validate.py), and every
other value a user or broker supplies (a task id in the Celery layer's marks and claims)
goes into a key through :func:`key_part`.
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import NamedTuple

#: The ``state`` field of a holder hash in its release delay (written by the release scripts,
#: lua/release.lua, multi_release.lua, interval_release.lua, rw_release.lua, and read by
#: the renew and acquire scripts). Stored data: a change of it is a change of the key layout
#: (core/layout.py).
RELEASE_DELAY_STATE = "release_delay"

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


#: What :func:`key_part` escapes: ``%`` (its own escape), the hash-tag braces (the listings'
#: patterns end in ``}:lock`` and ``}:<family>:h:*``), ``:`` (what separates the parts of a
#: key, so a part never spells a suffix of its own), SCAN's glob characters (a part can be
#: matched literally) and control characters (a key stays one line in a log).
_ESCAPED_IN_KEYS = re.compile(r"[%{}:*?\[\]\\\x00-\x1f\x7f]")


def key_part(value: str) -> str:
    """``value``, data a user or broker supplies (a task id), as one part of a key after the
    hash tag: each of ``%{}:*?[]\\`` and the ASCII control characters percent-escaped
    (``}`` -> ``%7D``), every other character as it is. One value, one part, and the other
    way round; a UUID task id is unchanged."""
    return _ESCAPED_IN_KEYS.sub(lambda found: f"%{ord(found[0]):02X}", value)


def data_key(base: bytes, kind: str, *parts: str | int) -> bytes:
    """The key ``<base><kind>:<part>:<part>...`` (``base``: a lock's ``P{T}:``) of a record
    of ``kind`` about ``parts``, each part escaped (:func:`key_part`), so that no value can
    shape the key into one another listing SCANs for."""
    escaped = (key_part(str(part)) for part in parts)
    return base + kind.encode() + b":" + b":".join(encode_name(part) for part in escaped)


def lock_pattern(prefix: str) -> bytes:
    """SCAN pattern matching the holder hash of every lock under ``prefix``."""
    return escape_glob(prefix.encode()) + b"{*}:lock"


def escape_glob(raw: bytes) -> bytes:
    """``raw`` with SCAN's glob characters backslash-escaped, so it matches only itself."""
    return b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c]) for c in raw)
