"""Who holds what, live or stale: the admin view of every lock kind.

Each family of lock kinds is in the registry (``kinds/registry.py``): the keys a listing
reads, how its holders are picked from them (one record per holder), and how a listed holder
is cleared. A listing reads each keyspace once (leases and multi-key locks share theirs).

Every family decodes its holder hashes into :class:`..core.holder.ListedHolder` records
(None: unknown). Ages are computed against the Redis server's clock (one TIME call per
listing), never this machine's.

The lock core decides staleness from the heartbeat alone (:func:`heartbeat_stopped`); the
Celery layer adds *checks* (workers' active tasks, the result backend) that may restate a
lock still marked live.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from ..core import steps, validate
from ..core.connection import Connection, HasConnection, connection_of
from ..core.holder import OWN_INFO_FIELDS, ListedHolder
from ..core.keys import RELEASE_DELAY_STATE
from ..core.patterns import escape, literal_name
from ..core.renewal import TICKS_PER_TTL
from ..core.scan import BATCH, Read, query_read
from ..core.steps import CheckLayout, Steps
from ..kinds.lease import CLAIM_OWNER_PREFIX
from ..kinds.registry import FAMILIES, LEASES, KindFamily

__all__ = [
    "BATCH", "CLAIMED", "CLAIM_OWNER_PREFIX", "HEARTBEAT_FRESH", "HEARTBEAT_STOPPED", "KINDS",
    "LEASES", "LIVE", "MISSED_TICKS", "NO_EVIDENCE", "QUEUED", "RELEASED_WITH_DELAY",
    "RELEASE_DELAY", "STALE", "STATES", "TICKS_PER_TTL", "Check", "Listing", "LockInfo", "Lister",
    "escape", "heartbeat_stopped", "list_locks", "listed", "listers", "listing",
    "literal_name", "lock_info", "server_ms", "skipped_note",
]  # fmt: skip

log = logging.getLogger("celery_singleton_lock.admin")

#: The ``kind`` of every holder a listing may show, family by family.
KINDS = tuple(kind for family in FAMILIES for kind in family.kinds)
LIVE, STALE = "live", "stale"
#: Released with a delay: no one holds it, the name stays locked until the delay ends.
RELEASE_DELAY = "release-delay"
#: A claim (celery/claims.py): held for a message waiting in the queue, not by a process.
QUEUED = "queued"
#: Every ``state`` a listed holder may have (the lock core's and the Celery layer's checks').
STATES = (LIVE, STALE, QUEUED, RELEASE_DELAY)

#: Evidence the lock core decides on; the Celery layer adds its own (see celery/evidence.py).
RELEASED_WITH_DELAY = "released with a delay"
HEARTBEAT_STOPPED = "heartbeat stopped"
HEARTBEAT_FRESH = "heartbeat fresh"
NO_EVIDENCE = "no evidence"
CLAIMED = "claim for a queued message"

#: A heartbeat ticks every ttl / TICKS_PER_TTL (core/heartbeat.py); a holder that missed
#: MISSED_TICKS ticks is gone.
MISSED_TICKS = 2

#: How one family of lock kinds is listed and cleared (an entry of the kind registry).
Lister = KindFamily


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
    #: Where and when ``pid`` names the holder (``core.pid_evidence.ProcessMark`` as stored):
    #: what a worker's start-up reads to know whether that process is gone. Not part of
    #: ``to_dict``.
    proc: str | None = dataclasses.field(default=None, repr=False)

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
        del document["renewed_ms"], document["proc"]
        return document


class Listing(list[LockInfo]):
    """What a listing found: its locks (a list of :class:`LockInfo`), and ``skipped``, how
    many keys matching a lock key pattern it passed by because they hold another type than
    the hash it reads (core/scan.py): not ours, so not shown, and not the end of the
    listing either."""

    skipped: int

    def __init__(self, infos: Iterable[LockInfo] = (), skipped: int = 0) -> None:
        super().__init__(infos)
        self.skipped = skipped

    def only(self, keep: Callable[[LockInfo], bool]) -> Listing:
        """The locks ``keep`` says yes to, with the same ``skipped``."""
        return Listing((info for info in self if keep(info)), self.skipped)


def skipped_note(skipped: int) -> str:
    """What a listing says of the keys it skipped (the CLI prints it; the log has it)."""
    return f"{skipped} key{'' if skipped == 1 else 's'} skipped: not of the expected type"


def listed(infos: list[LockInfo], skipped: int, prefix: str) -> Listing:
    """``infos`` as a :class:`Listing`; a warning when keys were skipped, so a program that
    lists through the API hears of them too."""
    if skipped:
        log.warning(
            "%s (keys under prefix %r matching a lock key pattern)", skipped_note(skipped), prefix
        )
    return Listing(infos, skipped)


#: A check looks at the listed locks and returns them, some perhaps restated.
Check = Callable[[list[LockInfo]], list[LockInfo]]


def listers() -> tuple[Lister, ...]:
    """Leases, reader-writer, range and multi-key locks, semaphores, from the kind
    registry."""
    return FAMILIES


def list_locks(
    client: Connection | HasConnection,
    pattern: str | None = None,
    *,
    checks: Sequence[Check] = (),
) -> Listing:
    """Every holder of every lock under ``client.prefix`` whose name matches the glob
    ``pattern`` (``fnmatchcase`` on the name, not the key), sorted by name and kind; the
    listing's ``skipped`` counts the keys it passed by (see :class:`Listing`).

    ``state`` comes from the heartbeat, then from each of ``checks`` in turn for the locks
    still undecided.
    """
    conn = connection_of(client)
    return conn.run(listing(conn.prefix, pattern, checks))


def listing(prefix: str, pattern: str | None, checks: Sequence[Check] = ()) -> Steps[Listing]:
    """:func:`list_locks`'s steps (for both clients) under ``prefix``: the key layout is
    read (not recorded), then the server's clock, then each keyspace once."""
    pattern = validate.check_pattern(pattern)
    yield CheckLayout(record=False)
    now_ms = yield from steps.server_ms()
    read: dict[str, Read] = {}  # keyspace -> what was read there: each is read once
    holders: list[ListedHolder] = []
    for family in listers():
        if family.keyspace not in read:
            read[family.keyspace] = yield from query_read(family.keys(prefix, pattern))
        holders += family.holders(read[family.keyspace].records, pattern)
    skipped = sum(found.skipped for found in read.values())
    return listed(lock_infos(holders, now_ms, pattern, checks), skipped, prefix)


def lock_infos(
    holders: list[ListedHolder], now_ms: int, pattern: str | None, checks: Sequence[Check] = ()
) -> list[LockInfo]:
    """The listed ``holders``, read at server time ``now_ms``, whose name matches the glob
    ``pattern``, restated by ``checks``, sorted by name and kind: for both clients."""
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


def lock_info(holder: ListedHolder, now_ms: int) -> LockInfo:
    """A listed holder seen at server time ``now_ms``, with its state from the heartbeat."""
    owner, renewed, ttl, pttl = holder.owner, holder.renewed_ms, holder.ttl_ms, holder.pttl_ms
    deadline, kind = holder.deadline_ms, holder.kind
    ranged = kind == "range"  # other kinds store lo/hi too, as [-inf, +inf]: not worth showing
    uses_heartbeat = None if holder.heartbeat is None else bool(holder.heartbeat)
    # A lease's release delay has no owner; an interval hold's keeps its owner (the admin clears
    # it by owner), so the state field alone says it was released.
    delayed = holder.state == RELEASE_DELAY_STATE
    # A claim is held for a queued message, not by a process: neither its heartbeat nor its
    # task's absence from the workers says anything.
    claimed = owner is not None and owner.startswith(CLAIM_OWNER_PREFIX)
    beating = uses_heartbeat is not False and not (delayed or claimed)
    if delayed:
        state, evidence = RELEASE_DELAY, RELEASED_WITH_DELAY
    elif claimed:
        state, evidence = QUEUED, CLAIMED
    elif uses_heartbeat and renewed is not None and heartbeat_stopped(now_ms, renewed, ttl):
        state, evidence = STALE, HEARTBEAT_STOPPED
    elif uses_heartbeat and renewed is not None:
        state, evidence = LIVE, HEARTBEAT_FRESH
    else:
        state, evidence = LIVE, NO_EVIDENCE
    return LockInfo(
        name=holder.name,
        kind=kind,
        state=state,
        evidence=evidence,
        task_id=holder.task_id,
        task_name=holder.task_name,
        host=holder.host,
        pid=holder.pid,
        thread=holder.thread,
        token=holder.token,
        owner=owner or None,
        heartbeat=uses_heartbeat,
        age_s=_claim_age(ttl, pttl) if claimed else _age(now_ms, holder.acquired_ms),
        lease_remaining_s=None if pttl is None or pttl < 0 else pttl / 1000,
        max_hold_remaining_s=None if not deadline else max(0, deadline - now_ms) / 1000,
        heartbeat_age_s=_age(now_ms, renewed) if beating else None,
        lo=_bound(holder.lo) if ranged else None,
        hi=_bound(holder.hi) if ranged else None,
        mode=holder.mode if ranged else None,
        info=_owner_info(holder.info),
        worker=holder.worker,
        limit=holder.limit,
        renewed_ms=renewed,
        proc=holder.proc,
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


def _owner_info(value: str | None) -> dict[str, Any] | None:
    """The stored ``owner_info`` JSON, without the keys that have their own fields."""
    if value is None:
        return None
    try:
        info = json.loads(value)
    except ValueError:
        return {"unreadable": value}
    if not isinstance(info, dict):
        return {"unreadable": value}
    extra = {k: v for k, v in info.items() if k not in OWN_INFO_FIELDS}
    return extra or None


def _bound(value: float | str | None) -> int | float | str | None:
    """A range bound as JSON can carry it: a number (an int when whole), ``"-inf"``/``"inf"``
    for an open end, else the text as written."""
    if value is None or isinstance(value, str):
        return value
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if math.isnan(value):
        return "nan"
    return int(value) if value.is_integer() else value
