"""One heartbeat tick, without I/O: how often ticks come, the script calls that renew one
connection's handles in one round trip (per node on a Redis Cluster), and what the codes of
their replies, or their failure, mean for each handle.

The thread heartbeat (:mod:`.heartbeat`) and the asyncio one (:mod:`..aio.heartbeat`) run
it, each sending the calls its own way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, cast

from ..exceptions import LockBackendError, LockNotReplicated
from . import redis_urls
from .replies import Reply
from .scripts import ScriptCall

if TYPE_CHECKING:
    from .connection import Connection, HasConnection

log = logging.getLogger("celery_singleton_lock.heartbeat")

#: Renewals per ttl: a heartbeat (the thread, and the asyncio task) renews every
#: ``ttl / TICKS_PER_TTL`` seconds, so a lease missing one tick still has time for the next.
#: The admin's staleness rule counts missed ticks of this same period.
TICKS_PER_TTL = 3

#: (handle, owner token, ttl ms, generation): one renewal the handle's class turns into
#: script arguments (the generation: see ``HandleState._begin_extend``).
RenewEntry = tuple[Any, str, int, int]

#: Builds the one script call renewing a group of units (its reply: one code per unit).
Renewer = Callable[["Connection", list[Any]], ScriptCall]

#: On a Redis Cluster, one piece of a handle's renewal: the renewer whose call takes it, a
#: key in the slot the unit's keys are in, and what the renewer takes for it. Units with the
#: same renewer and slot go in one call.
RenewUnit = tuple[Renewer, bytes, Any]


class Renewable(Protocol):
    """What a heartbeat (thread or task) needs of a handle: every lock kind's handle, sync
    or asyncio, is one. Its class supplies the script call renewing it
    (``_renew_script_call``, see :func:`renew_calls`) and, on a Redis Cluster, splits it into
    the units renewed in one slot (``_renew_units``)."""

    ttl: float
    _renewal: tuple[int, int]
    _owner: str | None

    @property
    def _conn(self) -> Any: ...

    def _renewed(self, owner: str | None, code: int, sent_at: float, gen: int) -> None: ...

    def _renewal_failed(self, owner: str | None, error: LockBackendError) -> None: ...


def tick_period(handles: Iterable[Renewable]) -> float | None:
    """Seconds between ticks: the shortest ttl held over ``TICKS_PER_TTL`` (None: nothing
    held)."""
    ttls = [handle.ttl for handle in handles]
    return min(ttls) / TICKS_PER_TTL if ttls else None


def by_connection(handles: Iterable[Renewable]) -> dict[int, list[Renewable]]:
    """``handles`` grouped by the connection they renew through (by its id): one round
    trip each."""
    groups: dict[int, list[Renewable]] = {}
    for handle in handles:
        groups.setdefault(id(handle._conn), []).append(handle)
    return groups


class RenewalRound:
    """The renewal of one connection's ``handles`` in one tick: the script calls to send
    in one round trip, and what their replies, or their failure, mean for each handle."""

    def __init__(self, handles: list[Renewable]) -> None:
        self.conn = handles[0]._conn
        # A handle released since the tick listed it has no owner token any more: renewing
        # it with none would renew its release delay instead (the scripts refuse that too).
        self.entries: list[RenewEntry] = [
            (handle, owner, *handle._renewal)
            for handle in handles
            if (owner := handle._owner) is not None
        ]
        self.calls, self._decode = renew_calls(self.conn, self.entries)

    def renewed(self, replies: list[Any], sent_at: float, holds: Callable[[Any], bool]) -> None:
        """Apply the ``replies`` of the calls sent at ``sent_at`` (monotonic) to each handle
        the heartbeat still ``holds`` (one released meanwhile has nothing to learn)."""
        codes = self._decode(replies)
        for (handle, owner, _, gen), code in zip(self.entries, codes, strict=True):
            if holds(handle):
                handle._renewed(owner, code, sent_at, gen)

    def failed(self, error: LockBackendError) -> None:
        """The calls did not get through: each handle judges, by its deadline, whether it
        is lost."""
        if isinstance(error, LockNotReplicated):
            # It did reach Redis: the master renewed, its replicas did not acknowledge.
            log.warning("heartbeat's renewals were not acknowledged by the replicas: %s", error)
        else:
            log.warning("heartbeat could not reach Redis: %s", error)
        for handle, owner, _, _ in self.entries:
            handle._renewal_failed(owner, error)


#: The most renewals one script call carries: a tick renewing more sends several calls, in
#: the same round trip. A script blocks Redis while it runs (about 3-5 µs per lease), and
#: Redis reads a pipeline a buffer at a time, serving other clients between its calls: so
#: a tick renewing thousands of holds blocks the server about as long as one call of this
#: many (1-2 ms on a small machine), not for the whole tick.
RENEWALS_PER_CALL = 250

#: Codes of renew.lua, worst first: the worst of a multi-key lock's names decides.
_RANK: dict[int, int] = {Reply.TAKEN: 3, Reply.GONE: 2, Reply.MAX_HOLD_REACHED: 1}


def renew_calls(
    client: Connection | HasConnection, entries: list[RenewEntry]
) -> tuple[list[ScriptCall], Callable[[list[Any]], list[int]]]:
    """The script calls renewing (handle, owner, ttl ms) ``entries``, and how to read one
    code per entry from their replies.

    One call per lock kind (its class's ``_renew_script_call``), and per
    :data:`RENEWALS_PER_CALL` renewals of that kind. On a Redis Cluster a script
    may only touch keys of one slot, so each handle splits itself into units
    (``_renew_units``), one call per renewer and slot, and a handle's code is the worst of
    its units' (a multi-key lock's names are renewed one by one like leases); the Cluster
    pipeline that runs the calls groups them by node, one round trip per node.
    """
    # A LockClient gives its Connection; a connection (sync or asyncio) is passed as itself.
    conn = cast("Connection", getattr(client, "connection", client))
    # (renewer, slot) -> [(entry index, what the renewer takes)]
    groups: dict[tuple[Renewer, int], list[tuple[int, Any]]] = {}
    if not (redis_urls.is_cluster(conn.redis) or redis_urls.is_async_cluster(conn.redis)):
        # Grouped by class first: this runs on every tick, for every handle held.
        by_kind: dict[Any, list[tuple[int, Any]]] = {}  # handle class -> its entries
        for i, entry in enumerate(entries):
            by_kind.setdefault(type(entry[0]), []).append((i, entry))
        groups = {(kind._renew_script_call, 0): group for kind, group in by_kind.items()}
    else:
        slot = conn.redis.keyslot
        for i, (handle, owner, ttl_ms, gen) in enumerate(entries):
            for renewer, key, unit in handle._renew_units(owner, ttl_ms, gen):
                groups.setdefault((renewer, slot(key)), []).append((i, unit))
    chunks = [
        (renewer, group[start : start + RENEWALS_PER_CALL])
        for (renewer, _), group in groups.items()
        for start in range(0, len(group), RENEWALS_PER_CALL)
    ]
    calls = [renewer(conn, [u for _, u in chunk]) for renewer, chunk in chunks]

    def decode(replies: list[Any]) -> list[int]:
        codes: list[int | None] = [None] * len(entries)
        for (_, group), reply in zip(chunks, replies, strict=True):
            for (i, _), raw in zip(group, reply, strict=True):
                code, was = int(raw), codes[i]
                worse, rank = _RANK.get(code, 0), _RANK.get(was, 0) if was is not None else -1
                if was is None or worse > rank or (worse == rank == 0 and code < was):
                    codes[i] = code
        return [Reply.GONE if code is None else code for code in codes]

    return calls, decode
