"""Multi-key locks: several exclusive leases taken all or nothing.

Each name is held in the very hash a :class:`Lease` on that name uses (``P{T}:lock``, see
keys.py), with ``kind = multi``, so a multi-lock over {a, b} and a plain lease on ``a``
exclude each other, and the lease tools (admin listing, clearing) see it. Each name gets its
own fencing token from its own counter (``P{T}:fence``).

On one Redis server every key is reachable from one script, so ``lua/multi_acquire.lua``
takes all names atomically: two multi-locks over overlapping names can never each hold part
of what the other needs, hence no deadlock. On a Redis Cluster client the names live in
different slots; there they are taken one by one in sorted key order (a global order, so no
cycle of waiters) and the ones taken are given back when a later one is busy.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..core import validate
from ..core.connection import Connection, ConnectionBase, HasConnection, connection_of
from ..core.handle import HolderRecord, LockHandle
from ..core.handle_ops import HandleOps, released_unreplicated
from ..core.heartbeat import RenewEntry, RenewUnit
from ..core.holder import ListedHolder, decode
from ..core.keys import LockKeys, encode_name, lock_keys
from ..core.options import LockOptions, ProcessOptions, options_after, options_after_two
from ..core.redis_urls import is_cluster
from ..core.replication import Replication
from ..core.replies import Reply, acquire_outcome
from ..core.scan import Record, read_query
from ..core.scripts import (
    ADVISORY,
    CLOCK,
    FENCING,
    TRACE,
    WAKE_FAIR_WAITER,
    ScriptCall,
    ScriptHost,
    Scripts,
    bound_to,
    pack_holder,
    register,
    source_after,
)
from ..core.steps import Steps
from ..exceptions import ConfigurationError, LockNotReplicated
from . import lease_listing
from .lease import process_hold_released, renew_lease_keys
from .lease_listing import lease_holders_read, lease_keys

if TYPE_CHECKING:
    from redis.commands.core import Script


class MultiScripts:
    """The multi-key scripts registered on one Redis client (no I/O); the acquire and the
    release wait for ``replication``'s replicas (the heartbeat's batches add the renewals'
    WAIT)."""

    def __init__(self, redis: Any, replication: Replication | None = None) -> None:
        self.acquire: Script = register(
            redis, source_after(CLOCK, FENCING, "multi_acquire"), replication
        )
        self.release: Script = register(
            redis, source_after(CLOCK, *WAKE_FAIR_WAITER, TRACE, "multi_release"), replication
        )
        self.renew: Script = register(
            redis, source_after(CLOCK, ADVISORY, "renew_hold", "multi_renew")
        )


def scripts(client: ScriptHost) -> MultiScripts:
    """The multi-key scripts of ``client`` (sync or asyncio), registered on first use."""
    return bound_to(client, MultiScripts)


def key_order(prefix: str, names: list[str]) -> tuple[tuple[LockKeys, ...], list[str]]:
    """The Redis keys of each of the (checked) ``names`` and the names, both in key order."""
    pairs = sorted(((lock_keys(prefix, name), name) for name in names), key=lambda p: p[0].lock)
    return tuple(keys for keys, _ in pairs), [name for _, name in pairs]


def check_names(names: object) -> list[str]:
    """A non-empty collection of lock names (not a single str), without duplicates."""
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise ConfigurationError("names", f"must be a collection of str, got {names!r}")
    checked = [validate.check_name(name, "names") for name in names]
    if not checked:
        raise ConfigurationError("names", "must not be empty")
    return sorted(set(checked))


def acquire_args(
    owner: str,
    ttl_ms: int,
    max_hold_ms: int,
    reserve: bool,
    ordered: Sequence[str],
    holder: Sequence[Any],
) -> list[Any]:
    """ARGV of multi_acquire.lua: owner, ttl, max-hold, wait mode ('1': mark the
    busy holders so their release publishes), the names in key order, the holder fields."""
    return [
        owner, ttl_ms, max_hold_ms, "1" if reserve else "",
        *(encode_name(name) for name in ordered), *holder,
    ]  # fmt: skip


def acquired(ordered: Sequence[str], reply: Sequence[Any]) -> tuple[bool, int, dict[str, int]]:
    """multi_acquire.lua's reply for the names in key order ``ordered``: (True, largest
    token, the token of each name) or (False, ms a waiter may sleep, {})."""
    if int(reply[0]) != Reply.DONE:
        return False, int(reply[1]), {}
    tokens = {name: int(t) for name, t in zip(ordered, reply[1:], strict=True)}
    return True, max(tokens.values()), tokens


def release_args(
    owner: str, delay_ms: int, keys: Sequence[LockKeys], tokens: Sequence[int] = ()
) -> list[Any]:
    """ARGV of multi_release.lua: owner, release delay ms, each name's channel, then the
    token of each name's hold (``tokens``, in key order; empty: not known)."""
    return [owner, delay_ms, *(k.channel for k in keys), *tokens]


class MultiLeaseOps(HandleOps):
    """The operations of a multi-key lock, for the sync :class:`MultiLease` and the asyncio
    one: all names taken atomically by one script (so no deadlock), released together."""

    kind = "multi"
    names: tuple[str, ...]
    keys: tuple[LockKeys, ...]
    _ordered: list[str]
    _tokens: dict[str, int]

    def _setup(self, client: Any, name: Any, options: LockOptions[Any]) -> None:
        # ``name``: the collection of names; the handle is named after them all.
        checked = check_names(name)
        super()._setup(client, " + ".join(checked), options)  # type: ignore[safe-super]
        self._set_names(checked)

    def _set_names(self, checked: list[str]) -> None:
        #: The names held, sorted.
        self.names = tuple(checked)
        #: The Redis keys of each name, in key order (and the names in that order).
        self.keys, self._ordered = key_order(self._conn.prefix, checked)
        # Woken by a release of any of the names.
        self._channels = tuple(keys.channel for keys in self.keys)
        self._tokens = {}

    @property
    def tokens(self) -> dict[str, int]:
        """The fencing token of each name (of the current or last acquisition)."""
        return dict(self._tokens)

    def _try_acquire(self, owner: str, reserve: bool) -> Steps[tuple[bool, int]]:
        if is_cluster(self._conn.redis):
            return (yield from self._try_acquire_in_order(owner, reserve))
        # multi_acquire.lua: KEYS locks then fences.
        reply = yield (
            scripts(self._conn).acquire,
            [k.lock for k in self.keys] + [k.fence for k in self.keys],
            acquire_args(
                owner, self._ttl_ms, self._max_hold_ms, reserve, self._ordered,
                self._describe_holder(named=False),
            ),
        )  # fmt: skip
        taken, value, tokens = acquired(self._ordered, reply)
        if taken:
            self._tokens = tokens
        return taken, value

    def _try_acquire_in_order(self, owner: str, reserve: bool) -> Steps[tuple[bool, int]]:
        """Redis Cluster: one lease per name in key order; on a busy name give back the rest."""
        base: Scripts = self._conn.scripts
        tokens: dict[str, int] = {}
        for keys, name in zip(self.keys, self._ordered, strict=True):
            holder = [b"name", encode_name(name), *self._describe_holder(named=False)]
            reply = yield base.acquire_call(
                keys.lock, keys.fence, owner, self._ttl_ms,
                self._max_hold_ms, pack_holder(holder), waiting=reserve,
            )  # fmt: skip
            taken, value = acquire_outcome(reply)
            if taken != Reply.DONE:
                for done in self.keys[: len(tokens)]:
                    yield base.release_call(done.lock, owner, 0)
                return False, int(value)
            tokens[name] = int(value)
        self._tokens = tokens
        return True, max(tokens.values())

    def _release(self, owner: str, delay_ms: int) -> Steps[int]:
        if is_cluster(self._conn.redis):
            return (yield from self._release_each(owner, delay_ms))
        keys = [k.lock for k in self.keys]
        tokens = [self._tokens[name] for name in self._ordered] if self._tokens else []
        args = release_args(owner, delay_ms, self.keys, tokens=tokens)
        return int((yield scripts(self._conn).release, keys, args))

    def _release_each(self, owner: str, delay_ms: int) -> Steps[int]:
        """Redis Cluster: each name released as a lease; the worst of their codes."""
        codes: list[int] = []
        unreplicated: LockNotReplicated | None = None
        scripts_: Scripts = self._conn.scripts
        for k, name in zip(self.keys, self._ordered, strict=True):
            try:
                call = scripts_.release_call(k.lock, owner, delay_ms, self._tokens.get(name))
                codes.append(int((yield call)))
            except LockNotReplicated as exc:
                # Released on the master: go on with the other names, then say so.
                codes.append(int(exc.replies[0]))
                unreplicated = exc
        code = next(
            (worst for worst in (Reply.TAKEN, Reply.GONE) if worst in codes),
            Reply.DONE,
        )
        if unreplicated is not None:
            raise LockNotReplicated(
                str(unreplicated), replies=[code], acknowledged=unreplicated.acknowledged
            )
        return code

    def _holders(self) -> Steps[list[HolderRecord]]:
        return lease_holders_read([keys.lock for keys in self.keys])

    def _release_holder(self, process: ProcessOptions) -> Steps[bool]:
        return holders_released(self._conn, self.names, process)

    @classmethod
    def _renew_script_call(cls, conn: Any, entries: list[RenewEntry]) -> ScriptCall:
        keys: list[bytes] = []
        args: list[Any] = []
        for handle, owner, ttl_ms, gen in entries:
            keys += (k.lock for k in handle.keys)
            args += (len(handle.keys), owner, ttl_ms, gen)
        return scripts(conn).renew, keys, args

    def _renew_units(self, owner: str, ttl_ms: int, gen: int) -> list[RenewUnit]:
        # A script may touch one slot only: each name is renewed as a lease is.
        return [(renew_lease_keys, k.lock, (k.lock, owner, ttl_ms, gen)) for k in self.keys]


class MultiLease(MultiLeaseOps, LockHandle):
    """Exclusive leases on several names, held together: taken all or nothing, renewed in
    the heartbeat's one round trip (one script call; per slot on Cluster), released together.
    Lease-like; ``token`` is the largest of the per-name fencing tokens and ``tokens`` maps
    each name to its own."""

    @options_after_two(LockOptions["MultiLease"])
    def __init__(
        self, client: Connection | HasConnection, names: object, options: LockOptions[MultiLease]
    ) -> None:
        self._setup(client, names, options)


def list_holders(
    client: Connection | HasConnection, pattern: str | None = None
) -> list[dict[str, Any]]:
    """One dict per name held by a multi-key lock under the client's prefix whose name
    matches the glob ``pattern`` (None: all); ``owner`` tells which names are held together."""
    conn = connection_of(client)
    found = multi_holders(read_query(conn, lease_keys(conn.prefix, pattern)).records, pattern)
    return [holder.as_dict() for holder in found]


def multi_holders(records: list[Record], pattern: str | None = None) -> list[ListedHolder]:
    """The names held by multi-key locks among lease ``records`` (the names live in lease
    keys), decoded, whose name matches the glob ``pattern`` (None: all)."""
    holders = []
    for fields, pttl in records:
        if fields.get(b"kind") != b"multi" or not fields.get(b"owner"):
            continue
        record = decode(fields, pttl)
        if pattern is None or fnmatch.fnmatchcase(record.name, pattern):
            holders.append(record)
    return holders


def clear_holder(
    client: Connection | HasConnection, name: str, owner: str, token: int | None = None
) -> bool:
    """Free ``name`` if the multi-key holder ``owner`` (with fencing ``token``, when given)
    still holds it, atomically, and wake its waiters. The holder's other names stay held
    until its next heartbeat finds this one gone and stops renewing them.

    The owner (and the token, when not given) is read first; the name is then cleared by
    that token as the admin's clear of a lease is (release.lua), which leaves the trace that
    answers the same clear sent again after its reply was lost (redis-py's retry) as
    cleared. Tokens are unique per name: the token read is that owner's hold, or, taken
    again meanwhile, it no longer matches and nothing is cleared."""
    conn = connection_of(client)
    name = validate.check_name(name)
    keys = conn.keys(name)
    owner = validate.check_text(owner, "owner")
    token = validate.check_optional_token(token)
    held_by, held_token = conn.call(conn.redis.hmget, keys.lock, "owner", "token")
    if held_by != owner.encode() or held_token is None:
        return False
    if token is not None and int(held_token) != token:
        return False
    holder = ListedHolder(name, "multi", owner=owner, token=int(held_token))
    script, script_keys, args = lease_listing.clear_call(conn, holder)
    return int(conn.call(script, keys=script_keys, args=args)) == Reply.DONE


@options_after(ProcessOptions)
def release_holder(
    client: Connection | HasConnection, names: Iterable[str], process: ProcessOptions
) -> bool:
    """Release (after a release delay of ``delay`` seconds) every one of ``names`` that task
    ``task_id`` in process ``pid`` on ``host`` (default: this machine) holds: for a
    supervisor whose child can no longer release. True if a name was released."""
    conn = connection_of(client)
    return conn.run(holders_released(conn, names, process))


def holders_released(conn: ConnectionBase, names: object, process: ProcessOptions) -> Steps[bool]:
    """:func:`release_holder`'s steps, on a sync or an asyncio connection."""
    checked = check_names(names)
    holder = process.check()
    # Every name, also after one found free: each is a hash of its own.
    freed: list[bool] = []
    unreplicated: LockNotReplicated | None = None
    for name in checked:
        try:
            freed.append((yield from process_hold_released(conn, conn.keys(name), holder)))
        except LockNotReplicated as exc:
            # Released on the master: go on with the other names, then say so.
            freed.append(int(exc.replies[0]) == Reply.DONE)
            unreplicated = exc
    if unreplicated is not None:
        raise released_unreplicated(" + ".join(checked), unreplicated, "released")
    return any(freed)
