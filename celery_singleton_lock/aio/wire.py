"""The pure halves of the script calls and reads the asyncio kinds and admin make: script
arguments built, replies decoded, holder records read and key patterns, with no I/O.

The sync kinds build the same arguments and read the same replies inline (``multi.py``,
``admin.py``); the interval holds' acquire and change calls are shared already
(:class:`..kinds.intervals.IntervalHold`). Nothing here does I/O or takes a client, so the sync side
can share these once it may import them (beside the constants they use, below ``aio``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..admin import STALE, LockInfo
from ..core.keys import FENCE_TTL_MS, RELEASE_DELAY_STATE, encode_name, lock_pattern
from ..core.replies import AcquireReply
from ..kinds.intervals import MODE_NAMES, decode_holder
from ..kinds.rwlock import FAMILY as RW_FAMILY

Holder = dict[str, Any]


# -- multi-key locks -------------------------------------------------------------------------


def multi_acquire_args(
    owner: str,
    ttl_ms: int,
    max_hold_ms: int,
    reserve: bool,
    ordered: Sequence[str],
    holder: Sequence[Any],
) -> tuple[Any, ...]:
    """ARGV of multi_acquire.lua: owner, ttl, max-hold, fence ttl, wait mode ('1': mark the
    busy holders so their release publishes), the names in key order, the holder fields."""
    return (
        owner, ttl_ms, max_hold_ms, FENCE_TTL_MS, "1" if reserve else "",
        *(encode_name(name) for name in ordered), *holder,
    )  # fmt: skip


def multi_acquired(
    ordered: Sequence[str], reply: Sequence[Any]
) -> tuple[bool, int, dict[str, int]]:
    """multi_acquire.lua's reply for the names in key order ``ordered``: (True, largest
    token, the token of each name) or (False, ms a waiter may sleep, {})."""
    if int(reply[0]) != AcquireReply.ACQUIRED:
        return False, int(reply[1]), {}
    tokens = {name: int(t) for name, t in zip(ordered, reply[1:], strict=True)}
    return True, max(tokens.values()), tokens


# -- interval locks (reader-writer and range) ------------------------------------------------


def interval_release_args(
    owner: str, delay_ms: int, channel: bytes, token: str = "", renewed_ms: str = ""
) -> tuple[Any, ...]:
    """ARGV of interval_release.lua: only if the fencing token is ``token`` and the last
    renewal ``renewed_ms``, when they are given."""
    return (owner, delay_ms, channel, token, renewed_ms)


def interval_holder_pattern(prefix: str, family: bytes) -> bytes:
    """SCAN pattern matching every holder hash of the ``family`` interval locks under
    ``prefix``."""
    # lock_pattern is "<escaped prefix>{*}:lock": the holder hashes are "...{*}:<family>:h:*".
    return lock_pattern(prefix).removesuffix(b"lock") + family + b":h:*"


def interval_holder(fields: dict[bytes, bytes], pttl: int, family: bytes) -> Holder:
    """An interval holder hash as a holder record; a reader-writer hold's kind is its mode."""
    record = decode_holder(fields, pttl)
    if family == RW_FAMILY:
        record["kind"] = MODE_NAMES.get(record.get("mode", ""), record.get("kind"))
    return record


# -- the admin view --------------------------------------------------------------------------


def lock_hash_holder(fields: dict[bytes, bytes], pttl: int) -> Holder | None:
    """A ``P{T}:lock`` hash as a holder record: a lease, a release delay, or one name of a
    multi-key lock; None for what is none of them (a multi-key name with no owner)."""
    kind = fields.get(b"kind", b"lease").decode()
    delayed = not fields.get(b"owner") and fields.get(b"state") == RELEASE_DELAY_STATE.encode()
    if kind == "multi" and fields.get(b"owner"):
        return decode_holder(fields, pttl)
    if kind == "lease" or delayed:
        holder: Holder = {k.decode(): v for k, v in fields.items()}
        holder.update(kind=kind, pttl_ms=pttl)
        return holder
    return None


def clear_guards(info: LockInfo, force: bool) -> tuple[str, str]:
    """The (fencing token, renewal ms) a clearing script checks for the listed holder
    ``info``: the renewal only for a holder listed stale and not ``force``d, so one whose
    heartbeat resumed since it was listed is left alone ('' where nothing is checked)."""
    token = "" if info.token is None else str(info.token)
    renewed = ""
    if info.state == STALE and not force and info.renewed_ms is not None:
        renewed = str(info.renewed_ms)
    return token, renewed
