"""The admin side of the lock core: who holds what, live or stale, and clearing safely.

Every lock kind has a *lister*: one function that reads its holders (one dict per holder) and
one that clears a listed holder if it is still the same one (and, if it was listed stale, not
renewed since). Leases are listed here; the other kinds (``rwlock``, ``rangelock``,
``multi``) plug in through their modules' ``list_holders``.

A holder dict has the fields ``name kind owner token acquired_ms renewed_ms ttl_ms
deadline_ms host pid thread task_name task_id worker lo hi pttl_ms`` (bytes, str or int;
missing means unknown) and optionally ``heartbeat`` (1/0) and ``state``. Ages are computed
against the Redis server's clock (one TIME call per listing), never this machine's.

The lock core decides staleness from the heartbeat alone; the Celery layer adds *checks*
(workers' active tasks, the result backend) that may restate a lock still marked live.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache
from typing import Any

from .core import validate
from .core.connection import Connection, HasConnection, connection_of
from .core.handle import OWN_INFO_FIELDS
from .core.keys import lock_keys, lock_pattern
from .core.scripts import register, source
from .exceptions import LockError

KINDS = ("lease", "read", "write", "upgradable", "range", "multi")
LIVE, STALE, COOLDOWN = "live", "stale", "cooldown"

#: Evidence the lock core decides on; the Celery layer adds its own (see evidence.py).
DELAY_AFTER = "delay-after"
HEARTBEAT_STOPPED = "heartbeat stopped"
HEARTBEAT_FRESH = "heartbeat fresh"
NO_EVIDENCE = "no evidence"
CLAIMED = "claim for a queued message"

#: Owner tokens of claims (claims.py): a lock held for a queued message, not a process, so
#: neither its heartbeat nor its task's absence from the workers says anything.
CLAIM_OWNER_PREFIX = "claim:"

#: A heartbeat ticks every ttl/TICKS_PER_TTL; a holder that missed MISSED_TICKS ticks is gone.
TICKS_PER_TTL = 3
MISSED_TICKS = 2

#: Keys read per pipeline round trip.
BATCH = 500

#: What clearing a listed holder did (the clear scripts' codes).
CLEARED = 1
#: Released, expired or taken again since it was listed: nothing to clear.
GONE = 0
#: Another holder has it now.
TAKEN = -1
#: Listed stale, renewed since: its heartbeat resumed (a paused process, a prompt left open).
RESUMED = -2

Holder = dict[str, Any]


@dataclass(frozen=True)
class LockInfo:
    """One holder of one lock, as an administrator sees it.

    Times are seconds, measured on the Redis server's clock; ``None`` means unknown or not
    applicable (``lease_remaining_s`` is ``None`` for a key with no expiry,
    ``max_hold_remaining_s`` when there is no max-hold, ``heartbeat_age_s`` when the holder
    does not use the heartbeat). ``evidence`` says what decided ``state``.
    """

    name: str
    kind: str
    state: str
    evidence: str
    task_id: str | None
    task_name: str | None
    host: str | None
    pid: int | None
    thread: str | None
    token: int | None
    owner: str | None
    heartbeat: bool | None
    age_s: float | None
    lease_remaining_s: float | None
    max_hold_remaining_s: float | None
    heartbeat_age_s: float | None
    lo: int | float | str | None = None
    hi: int | float | str | None = None
    #: For range locks: read, upgradable or write.
    mode: str | None = None
    #: The holder's ``owner_info`` other than ``task_name``, ``task_id`` and ``worker``.
    info: dict[str, Any] | None = None
    #: The Celery worker node that ran the holder's task (``celery@host``), if recorded.
    worker: str | None = None
    #: The server time (ms) of the holder's last renewal as listed: a clear of a stale lock
    #: checks that it is unchanged. Not part of ``to_dict``.
    renewed_ms: int | None = dataclasses.field(default=None, repr=False)

    @property
    def undecided(self) -> bool:
        """Live only for want of evidence against it: a check may still restate it."""
        return self.state == LIVE and self.evidence in (HEARTBEAT_FRESH, NO_EVIDENCE)

    def restated(self, state: str, evidence: str) -> LockInfo:
        """A copy with another state and the evidence for it."""
        return dataclasses.replace(self, state=state, evidence=evidence)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``--json`` (documented in docs/admin.md)."""
        document = dataclasses.asdict(self)
        del document["renewed_ms"]
        return document


#: A check looks at the listed locks and returns them, some perhaps restated.
Check = Callable[[list[LockInfo]], list[LockInfo]]


@dataclass(frozen=True)
class Lister:
    """How one family of lock kinds is listed and cleared."""

    kinds: tuple[str, ...]
    list_holders: Callable[[Connection, str | None], list[Holder]]
    #: Clear the listed holder if it still holds (and, when the holder dict has a
    #: ``renewed_ms``, was not renewed since); CLEARED, GONE, TAKEN or RESUMED.
    clear_holder: Callable[[Connection, Holder], int]


# -- leases ----------------------------------------------------------------------------------


def list_lease_holders(client: Connection, pattern: str | None) -> list[Holder]:
    """Every lease under ``client.prefix`` (SCAN, then one pipeline per ``BATCH`` keys).

    A ``pattern`` that names one lock literally is read by its key, without a SCAN.
    """
    name = None if pattern is None else literal_name(pattern)
    if name is not None:
        keys = [lock_keys(client.prefix, name).lock]
    else:
        found = client.call(
            lambda: list(client.redis.scan_iter(match=lock_pattern(client.prefix), count=BATCH))
        )
        keys = list(dict.fromkeys(found))  # SCAN may return a key twice
    holders: list[Holder] = []
    for start in range(0, len(keys), BATCH):
        batch = keys[start : start + BATCH]
        pipe = client.redis.pipeline(transaction=False)
        for key in batch:
            pipe.hgetall(key)
            pipe.pttl(key)
        replies = client.call(pipe.execute)
        for i in range(len(batch)):
            fields, pttl = replies[2 * i], replies[2 * i + 1]
            if not fields:
                continue  # released between SCAN and read
            holder = {_text(k): v for k, v in fields.items()}
            kind = _text(holder.get("kind", b"lease"))
            cooling = not holder.get("owner") and _text(holder.get("state", b"")) == COOLDOWN
            if kind != "lease" and not cooling:
                continue  # a name held by a multi-key lock: multi.py lists its holders
            holder["kind"] = kind
            holder["pttl_ms"] = pttl
            holders.append(holder)
    return holders


def clear_lease_holder(client: Connection, holder: Holder) -> int:
    """Delete the lease (or one name of a multi-key lock, or the delay-after any holder left
    on a lease key) if it still carries the listed fencing token and, when the holder dict
    has a ``renewed_ms``, was not renewed since (clear.lua); a code of clear.lua."""
    keys = lock_keys(client.prefix, _text(holder["name"]))
    script = _clear_script(client)
    renewed = holder.get("renewed_ms")
    args = (str(holder["token"]), keys.channel, "" if renewed is None else str(renewed))
    return int(client.call(script, keys=(keys.lock,), args=args))


def _clear_script(client: Connection) -> Any:
    # Registering computes a SHA, no I/O; admin calls are rare enough to do it per call.
    return register(client.redis, source("clear"))


# -- the registry ----------------------------------------------------------------------------

LEASES = Lister(("lease",), list_lease_holders, clear_lease_holder)


@cache
def listers() -> tuple[Lister, ...]:
    """Leases, reader-writer, range and multi-key locks: each module lists its own holders
    with ``list_holders(client, pattern)``. A multi-key lock holds each name in a lease's
    hash, so its names are cleared as leases are: by fencing token, one name at a time."""
    # Imported here: those modules build on the client, which imports this module.
    from .kinds import multi, rangelock, rwlock

    return (
        LEASES,
        Lister(("read", "write", "upgradable"), rwlock.list_holders, _interval_clear(b"rw")),
        Lister(("range",), rangelock.list_holders, _interval_clear(b"range")),
        Lister(("multi",), multi.list_holders, clear_lease_holder),
    )


def _interval_clear(family: bytes) -> Callable[[Connection, Holder], int]:
    """Clear one hold of an interval lock by its owner and fencing token (so a holder that
    left and came back under the same owner is left alone)."""
    from .kinds.intervals import clear_hold

    def clear(client: Connection, holder: Holder) -> int:
        token = holder.get("token")
        return clear_hold(
            client,
            family,
            _text(holder["name"]),
            _text(holder.get("owner") or ""),
            token=None if token is None else int(token),
            renewed_ms=holder.get("renewed_ms"),
        )

    return clear


# -- listing ---------------------------------------------------------------------------------


def list_locks(
    client: Connection | HasConnection,
    pattern: str | None = None,
    *,
    checks: Sequence[Check] = (),
) -> list[LockInfo]:
    """Every holder of every lock under ``client.prefix`` whose name matches the glob
    ``pattern`` (``fnmatchcase`` on the name, not the key), sorted by name and kind.

    ``state`` comes from the heartbeat, then from each of ``checks`` in turn for the locks
    still undecided.
    """
    pattern = validate.check_pattern(pattern)
    conn = connection_of(client)
    now_ms = server_ms(conn)
    infos = [
        info
        for lister in listers()
        for info in (lock_info(holder, now_ms) for holder in lister.list_holders(conn, pattern))
        if pattern is None or fnmatchcase(info.name, pattern)
    ]
    for check in checks:
        infos = check(infos)
    return sorted(infos, key=lambda i: (i.name, i.kind, str(i.lo), i.token or 0))


def server_ms(client: Connection | HasConnection) -> int:
    """The Redis server's clock in ms (the clock every lock time is written with)."""
    return connection_of(client).server_ms()


def lock_info(holder: Holder, now_ms: int) -> LockInfo:
    """A holder dict seen at server time ``now_ms``, with its state from the heartbeat."""
    owner = _opt_text(holder.get("owner"))
    acquired = _opt_int(holder.get("acquired_ms"))
    renewed = _opt_int(holder.get("renewed_ms"))
    ttl = _opt_int(holder.get("ttl_ms"))
    deadline = _opt_int(holder.get("deadline_ms"))
    pttl = _opt_int(holder.get("pttl_ms"))
    beat = _opt_int(holder.get("heartbeat"))
    kind = _text(holder.get("kind", "lease"))
    ranged = kind == "range"  # other kinds store lo/hi too, as [-inf, +inf]: not worth showing
    uses_heartbeat = None if beat is None else bool(beat)
    # A lease's delay-after has no owner; an interval hold's keeps its owner (the admin clears
    # it by owner), so the state field alone says it was released.
    cooling = _opt_text(holder.get("state")) == COOLDOWN
    claimed = owner is not None and owner.startswith(CLAIM_OWNER_PREFIX)
    heartbeat_age = None
    if renewed is not None and uses_heartbeat is not False and not (cooling or claimed):
        heartbeat_age = max(0, now_ms - renewed) / 1000
    if cooling:
        state, evidence = COOLDOWN, DELAY_AFTER
    elif claimed:
        state, evidence = LIVE, CLAIMED
    elif (
        uses_heartbeat
        and renewed is not None
        and ttl
        and now_ms - renewed > ttl * MISSED_TICKS / TICKS_PER_TTL
    ):
        state, evidence = STALE, HEARTBEAT_STOPPED
    elif uses_heartbeat and renewed is not None:
        state, evidence = LIVE, HEARTBEAT_FRESH
    else:
        state, evidence = LIVE, NO_EVIDENCE
    return LockInfo(
        name=_text(holder.get("name", "")),
        kind=kind,
        state=state,
        evidence=evidence,
        task_id=_opt_text(holder.get("task_id")),
        task_name=_opt_text(holder.get("task_name")),
        host=_opt_text(holder.get("host")),
        pid=_opt_int(holder.get("pid")),
        thread=_opt_text(holder.get("thread")),
        token=_opt_int(holder.get("token")),
        owner=owner or None,
        heartbeat=uses_heartbeat,
        age_s=None if acquired is None else max(0, now_ms - acquired) / 1000,
        lease_remaining_s=None if pttl is None or pttl < 0 else pttl / 1000,
        max_hold_remaining_s=None if not deadline else max(0, deadline - now_ms) / 1000,
        heartbeat_age_s=heartbeat_age,
        lo=_bound(holder.get("lo")) if ranged else None,
        hi=_bound(holder.get("hi")) if ranged else None,
        mode=_opt_text(holder.get("mode")) if ranged else None,
        info=_owner_info(holder.get("info")),
        worker=_opt_text(holder.get("worker")),
        renewed_ms=renewed,
    )


# -- clearing --------------------------------------------------------------------------------


def clear_info(client: Connection | HasConnection, info: LockInfo) -> bool:
    """Clear the listed holder ``info`` if it still holds (token/owner-checked, atomic), and,
    if it was listed stale, only if it was not renewed since: True if cleared, False if it
    was gone, the name has another holder now, or its heartbeat resumed."""
    return clear_listed(client, info) == CLEARED


def clear_listed(client: Connection | HasConnection, info: LockInfo, *, force: bool = False) -> int:
    """Clear the listed holder ``info`` in one atomic step that checks it is still that
    holder (its fencing token) and, unless ``force``, that a holder listed stale is still
    stale: not renewed since it was listed. CLEARED, GONE, TAKEN or RESUMED."""
    conn = connection_of(client)
    holder: Holder = {"name": info.name, "kind": info.kind, "owner": info.owner or ""}
    holder.update(token=info.token, lo=info.lo, hi=info.hi)
    if info.state == STALE and not force and info.renewed_ms is not None:
        holder["renewed_ms"] = info.renewed_ms
    if info.state == COOLDOWN and info.kind in ("lease", "multi"):
        return LEASES.clear_holder(conn, holder)  # an ownerless hash on a lease key
    for lister in listers():
        if info.kind in lister.kinds:
            return lister.clear_holder(conn, holder)
    return GONE


def clear(
    client: Connection | HasConnection,
    name: str,
    *,
    token: int | None = None,
    force: bool = False,
) -> bool:
    """Clear every holder of lock ``name`` (only the one with fencing ``token``, if given).

    Refuses, clearing nothing, with :class:`LockError` if one of them is live (its
    heartbeat is fresh, or it has no heartbeat) and ``force`` is false. Returns True if
    something was cleared; a lock re-acquired since it was read is left alone. Without
    ``force``, a holder read as stale whose heartbeat resumed before the clear is left alone
    too, and :class:`LockError` says so (after the other holders were cleared).
    """
    name = validate.check_name(name)
    token = validate.check_optional_token(token)
    force = validate.check_bool(force, "force")
    conn = connection_of(client)
    infos = [
        info
        for info in list_locks(conn, escape(name))
        if info.name == name and (token is None or info.token == token)
    ]
    live = [info for info in infos if info.state == LIVE]
    if live and not force:
        raise LockError(
            f"lock {name!r} is live ({live[0].evidence}); clear it with force=True", name=name
        )
    codes = [clear_listed(conn, info, force=force) for info in infos]
    if RESUMED in codes:
        raise LockError(
            f"lock {name!r} left alone: heartbeat resumed since it was listed stale", name=name
        )
    return CLEARED in codes


# -- names and patterns ----------------------------------------------------------------------

_MAGIC = re.compile(r"([*?\[])")


def escape(name: str) -> str:
    """A glob pattern matching exactly ``name``."""
    return _MAGIC.sub(r"[\1]", name)


def literal_name(pattern: str) -> str | None:
    """The one name ``pattern`` matches if it has no wildcard (``[x]`` escapes allowed)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char in "*?":
            return None
        if char == "[":
            if pattern[i + 2 : i + 3] != "]" or pattern[i + 1 : i + 2] not in ("*", "?", "["):
                return None
            char, i = pattern[i + 1], i + 2
        out.append(char)
        i += 1
    return "".join(out)


# -- decoding --------------------------------------------------------------------------------


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogatepass")
    return str(value)


def _owner_info(value: Any) -> dict[str, Any] | None:
    """The stored ``owner_info`` JSON, without the keys that have their own fields."""
    if value is None:
        return None
    try:
        info = json.loads(_text(value))
    except ValueError:
        return {"unreadable": _text(value)}
    if not isinstance(info, dict):
        return {"unreadable": _text(value)}
    extra = {k: v for k, v in info.items() if k not in OWN_INFO_FIELDS}
    return extra or None


def _opt_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _opt_int(value: Any) -> int | None:
    if value is None or value == b"" or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _bound(value: Any) -> int | float | str | None:
    """A range bound as JSON can carry it: a number (an int when whole), ``"-inf"``/``"inf"``
    for an open end, else the text as written."""
    if value is None or isinstance(value, int):
        return value
    if not isinstance(value, float):
        text = _text(value)
        try:
            value = float(text)
        except ValueError:
            return text
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if math.isnan(value):
        return "nan"
    return int(value) if value.is_integer() else value
