"""Who holds what, live or stale: the admin view of every lock kind.

Each family of lock kinds is in the registry (``kinds/registry.py``): the keys a listing
reads, how its holders are picked from them (one dict per holder), and how a listed holder
is cleared. A listing reads each keyspace once (leases and multi-key locks share theirs).

A holder dict has the fields ``name kind owner token acquired_ms renewed_ms ttl_ms
deadline_ms host pid thread task_name task_id worker lo hi limit pttl_ms`` (bytes, str or int;
missing means unknown) and optionally ``heartbeat`` (1/0) and ``state``. Ages are computed
against the Redis server's clock (one TIME call per listing), never this machine's.

The lock core decides staleness from the heartbeat alone (:func:`heartbeat_stopped`); the
Celery layer adds *checks* (workers' active tasks, the result backend) that may restate a
lock still marked live.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from ..core import validate
from ..core.connection import Connection, HasConnection, connection_of
from ..core.handle import OWN_INFO_FIELDS
from ..core.patterns import escape, literal_name
from ..core.scan import BATCH, Record, read_hashes
from ..kinds.registry import FAMILIES, LEASES, KindFamily

__all__ = [
    "BATCH", "CLAIMED", "CLAIM_OWNER_PREFIX", "COOLDOWN", "DELAY_AFTER", "HEARTBEAT_FRESH",
    "HEARTBEAT_STOPPED", "KINDS", "LEASES", "LIVE", "MISSED_TICKS", "NO_EVIDENCE", "QUEUED",
    "STALE", "TICKS_PER_TTL", "Check", "Holder", "LockInfo", "Lister", "escape",
    "heartbeat_stopped", "list_locks", "listers",
    "literal_name", "lock_info", "server_ms",
]  # fmt: skip

#: The ``kind`` of every holder a listing may show, family by family.
KINDS = tuple(kind for family in FAMILIES for kind in family.kinds)
LIVE, STALE, COOLDOWN = "live", "stale", "cooldown"
#: A claim (celery/claims.py): held for a message waiting in the queue, not by a process.
QUEUED = "queued"

#: Evidence the lock core decides on; the Celery layer adds its own (see celery/evidence.py).
DELAY_AFTER = "delay-after"
HEARTBEAT_STOPPED = "heartbeat stopped"
HEARTBEAT_FRESH = "heartbeat fresh"
NO_EVIDENCE = "no evidence"
CLAIMED = "claim for a queued message"

#: Owner tokens of claims (celery/claims.py): a lock held for a queued message, not a process, so
#: neither its heartbeat nor its task's absence from the workers says anything.
CLAIM_OWNER_PREFIX = "claim:"

#: A heartbeat ticks every ttl/TICKS_PER_TTL; a holder that missed MISSED_TICKS ticks is gone.
TICKS_PER_TTL = 3
MISSED_TICKS = 2

#: How one family of lock kinds is listed and cleared (an entry of the kind registry).
Lister = KindFamily

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
    #: The holder's task state as the result backend reports it (``PENDING``, ``SUCCESS``...),
    #: when it was asked (``celery locks``, for claims and holders without a heartbeat).
    task_state: str | None = None
    #: For a semaphore's permit: how many permits of the name the call that took it allowed.
    limit: int | None = None
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


def listers() -> tuple[Lister, ...]:
    """Leases, reader-writer, range and multi-key locks, semaphores, from the kind
    registry."""
    return FAMILIES


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
    read: dict[str, list[Record]] = {}  # keyspace -> its records: each is read once
    holders: list[Holder] = []
    for family in listers():
        if family.keyspace not in read:
            read[family.keyspace] = read_hashes(conn, family.keys(conn, pattern))
        holders += family.holders(read[family.keyspace], pattern)
    infos = [
        info
        for info in (lock_info(holder, now_ms) for holder in holders)
        if pattern is None or fnmatchcase(info.name, pattern)
    ]
    for check in checks:
        infos = check(infos)
    return sorted(infos, key=lambda i: (i.name, i.kind, str(i.lo), i.token or 0))


def server_ms(client: Connection | HasConnection) -> int:
    """The Redis server's clock in ms (the clock every lock time is written with)."""
    return connection_of(client).server_ms()


def heartbeat_stopped(now_ms: int, renewed_ms: int, ttl_ms: int | None) -> bool:
    """The staleness rule: a holder renewed every ttl / ``TICKS_PER_TTL`` that has not been
    renewed for ``MISSED_TICKS`` of those ticks (server ms) is gone."""
    return bool(ttl_ms) and now_ms - renewed_ms > (ttl_ms or 0) * MISSED_TICKS / TICKS_PER_TTL


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
        state, evidence = QUEUED, CLAIMED
    elif uses_heartbeat and renewed is not None and heartbeat_stopped(now_ms, renewed, ttl):
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
        age_s=_claim_age(ttl, pttl) if claimed else _age(now_ms, acquired),
        lease_remaining_s=None if pttl is None or pttl < 0 else pttl / 1000,
        max_hold_remaining_s=None if not deadline else max(0, deadline - now_ms) / 1000,
        heartbeat_age_s=heartbeat_age,
        lo=_bound(holder.get("lo")) if ranged else None,
        hi=_bound(holder.get("hi")) if ranged else None,
        mode=_opt_text(holder.get("mode")) if ranged else None,
        info=_owner_info(holder.get("info")),
        worker=_opt_text(holder.get("worker")),
        limit=_opt_int(holder.get("limit")),
        renewed_ms=renewed,
    )


def _age(now_ms: int, since_ms: int | None) -> float | None:
    return None if since_ms is None else max(0, now_ms - since_ms) / 1000


def _claim_age(ttl_ms: int | None, pttl_ms: int | None) -> float | None:
    """How long a claim has waited: since its message was sent, or since a retry was handed
    the run's lock (which keeps the run's ``acquired_ms``): the part of the expiry it was
    given (``ttl_ms``, rewritten each time) that has run out, on the server's clock."""
    if ttl_ms is None or pttl_ms is None or pttl_ms < 0:
        return None
    return max(0, ttl_ms - pttl_ms) / 1000


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
