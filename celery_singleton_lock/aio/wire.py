"""The pure halves of the reads the asyncio admin makes: holder records read and key
patterns, with no I/O. (Each kind's script arguments and replies are in its sync module.)"""

from __future__ import annotations

from typing import Any

from ..admin import COOLDOWN, STALE, LockInfo
from ..core.keys import lock_pattern
from ..kinds.intervals import MODE_NAMES, decode_holder
from ..kinds.rwlock import FAMILY as RW_FAMILY

Holder = dict[str, Any]


# -- interval locks (reader-writer and range) ------------------------------------------------


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
    """A ``P{T}:lock`` hash as a holder record: a lease, a delay-after, or one name of a
    multi-key lock; None for what is none of them (a multi-key name with no owner)."""
    kind = fields.get(b"kind", b"lease").decode()
    cooling = not fields.get(b"owner") and fields.get(b"state") == COOLDOWN.encode()
    if kind == "multi" and fields.get(b"owner"):
        return decode_holder(fields, pttl)
    if kind == "lease" or cooling:
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
