"""The Lua scripts, loaded from ``lua/*.lua`` and registered once per Redis client.

Registering does no I/O; each script is called by SHA and loaded on NOSCRIPT (after a restart
or ``SCRIPT FLUSH``), also inside pipelines, and on a Cluster only on the node that ran it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from importlib import resources
from typing import Any, Protocol, TypeVar

from redis.client import Pipeline
from redis.commands.core import Script as RedisScript
from redis.exceptions import ClusterError, NoScriptError, TryAgainError
from redis.typing import EncodableT, KeyT

from .keys import FENCE_TTL_MS, key_base
from .redis_urls import is_async_cluster, is_cluster
from .replication import Replication
from .replies import AcquireReply, HolderReply

T = TypeVar("T")

SCRIPT_NAMES = (
    "acquire",
    "acquire_undo",
    "release",
    "renew",
    "handover",
    "release_holder",
    "fair_abandon",
)


class Script(RedisScript):
    """A registered script that, on a Redis Cluster, loads itself only on the node it runs on.

    redis-py's Script answers NOSCRIPT with SCRIPT LOAD on *every* primary: while one primary
    is down (a failover in progress) that fails, and with it every lock on the healthy nodes
    whose script cache was empty (a restarted or newly added node).

    Anywhere else it is sent as redis-py's Script sends it, through the client's public API
    (a connection of its pool, so the pool's ``max_connections`` holds), loaded on NOSCRIPT;
    in a pipeline it is redis-py's Script, loaded before the pipeline runs. On a plain
    client it calls ``execute_command`` itself: the layers between (``Script.__call__`` and
    ``evalsha``) would add their Python to every acquire and release.

    With a ``replication``, a call goes through :func:`run_batch` with its ``WAIT``."""

    def __init__(
        self, registered_client: Any, script: Any, replication: Replication | None = None
    ) -> None:
        super().__init__(registered_client, script)
        self._cluster = is_cluster(registered_client)
        #: Told once: an isinstance test of a redis-py client runs typing's Protocol check.
        self._plain = not self._cluster and not isinstance(registered_client, Pipeline)
        self.replication = replication

    def __call__(
        self,
        keys: Sequence[KeyT] | None = None,
        args: Iterable[EncodableT] | None = None,
        client: Any = None,
    ) -> Any:
        keys, args = keys or (), args or ()
        if client is None:
            if self.replication is not None:
                call = (self, keys, tuple(args))
                return run_batch(self.registered_client, [call], self.replication)[0]
            if self._plain:
                return self._evalsha(self.registered_client, keys, args)
            client = self.registered_client
        if is_cluster(client):
            return self._on_node(client, list(keys), list(args))
        if isinstance(client, Pipeline):
            return super().__call__(keys, args, client)
        return self._evalsha(client, keys, args)

    def _evalsha(self, client: Any, keys: Sequence[KeyT], args: Iterable[EncodableT]) -> Any:
        try:
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            self.sha = client.script_load(self.script)
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)

    def _on_node(self, client: Any, keys: list[Any], args: list[Any]) -> Any:
        """Run on the node of the keys' slot; while that slot is being migrated, again until
        it answers (:data:`SLOT_MIGRATION_RETRY`)."""
        deadline = time.monotonic() + SLOT_MIGRATION_RETRY
        while True:
            try:
                return self._once_on_node(client, keys, args)
            except SLOT_MIGRATION_ERRORS:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(SLOT_MIGRATION_BACKOFF)

    def _once_on_node(self, client: Any, keys: list[Any], args: list[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            self.sha = load_on_node(client, self.script, client.get_node_from_key(keys[0]))
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # Sent on with ASK to the node importing the slot, which has not loaded it: EVAL
            # runs it there (and caches it) without knowing that node beforehand.
            return client.eval(self.script, len(keys), *keys, *args)


#: What redis-py raises for a Cluster command whose slot is half-migrated once its own
#: retries are spent: TRYAGAIN (a multi-key command whose keys are split between the
#: migrating and the importing node), or ``ClusterError`` ("TTL exhausted": every try was
#: answered TRYAGAIN, ASK, MOVED or CLUSTERDOWN; a lost connection raises otherwise). The
#: script did not run, so sending it again is safe.
SLOT_MIGRATION_ERRORS = (TryAgainError, ClusterError)

#: How long (s) a script call keeps being sent again while its slot is half-migrated (a
#: reshard moves a slot's keys in a few MIGRATE batches), before the error reaches the
#: caller as a LockBackendError; and the pause between two tries (redis-py's own retries
#: already last about 0.4 s).
SLOT_MIGRATION_RETRY = 2.0
SLOT_MIGRATION_BACKOFF = 0.05


def register(redis: Any, text: str, replication: Replication | None = None) -> Script:
    """``text`` as a :class:`Script` bound to ``redis`` (no I/O); with ``replication``, each
    call waits for its replicas (see :func:`run_batch`); on a Redis Cluster, with its releases
    published to the channel's shard (:func:`sharded`)."""
    if is_cluster(redis) or is_async_cluster(redis):
        text = sharded(text)
    return Script(redis, text, replication)


#: Publishes on the channel's shard (SPUBLISH: the message stays on the node owning the
#: channel's slot, which is the lock's), or, where the server has no SPUBLISH (before Redis
#: 7), with PUBLISH to every node. The listener decides the same way per node
#: (:mod:`.notifier`), so a waiter subscribes the way its release is published.
SHARDED_PUBLISH = """\
local function publish_sharded(channel, message)
  local reply = redis.pcall('SPUBLISH', channel, message)
  if type(reply) == 'table' and reply.err then
    return redis.call('PUBLISH', channel, message)
  end
  return reply
end
"""


def sharded(text: str) -> str:
    """Script ``text`` with each ``redis.call('PUBLISH', ...)`` publishing on the channel's
    shard, as on a Redis Cluster."""
    if PUBLISH_CALL not in text:
        return text
    return SHARDED_PUBLISH + text.replace(PUBLISH_CALL, "publish_sharded(")


PUBLISH_CALL = "redis.call('PUBLISH', "


def load_on_node(redis: Any, text: Any, node: Any) -> str:
    """SCRIPT LOAD ``text`` on the Cluster node ``node`` only; its SHA."""
    return str(redis.execute_command("SCRIPT LOAD", text, target_nodes=node))


@cache
def source(name: str) -> str:
    """The text of ``lua/<name>.lua`` from the installed package."""
    return (resources.files("celery_singleton_lock") / "lua" / f"{name}.lua").read_text("utf-8")


def source_after(*names: str) -> str:
    """The last of ``lua/<name>.lua`` with the others, the functions it calls, before it
    (in the order given)."""
    return "\n".join(source(name) for name in names)


#: The prelude of every script that gives a new holder a fencing token.
FENCING = "fencing"


def with_fence_ttl(name: str) -> str:
    """``lua/<name>.lua`` after a line defining ``FENCE_TTL_MS`` (a constant of the script
    rather than an argument sent with every call) and the fencing-token function."""
    return f"local FENCE_TTL_MS = {FENCE_TTL_MS}\n" + source_after(FENCING, name)


def pack_holder(fields: Sequence[Any]) -> bytes:
    """The holder's field, value pairs (bytes, str or int) as the one argument acquire.lua
    unpacks into hash fields: a MessagePack array of strings (``cmsgpack`` in Redis's Lua).
    Built once per process and thread by a handle, so that an acquire sends one pre-encoded
    argument instead of a dozen to encode; str is UTF-8, an int its decimal digits (as
    redis-py would send them)."""
    return array_header(len(fields)) + pack_items(fields)


def pack_items(fields: Sequence[Any]) -> bytes:
    """The items of :func:`pack_holder`'s array, without its header: a caller that keeps
    some fields packed joins them with others under one ``array_header``."""
    parts: list[bytes] = []
    append = parts.append
    for value in fields:
        if isinstance(value, bytes):
            raw = value
        elif isinstance(value, str):
            raw = value.encode()
        elif isinstance(value, int) and not isinstance(value, bool):
            raw = str(value).encode()
        else:
            raise TypeError(f"a holder field must be bytes, str or int, not {type(value)!r}")
        size = len(raw)
        # A template's lease packs its name and owner_info on every acquire: the headers of
        # short strings come from a table rather than a call building them.
        append(_SHORT_STR_HEADERS[size] if size < 0x100 else _str_header(size))
        append(raw)
    return b"".join(parts)


def array_header(size: int) -> bytes:
    """MessagePack: fixarray, array 16 or array 32 of ``size`` items."""
    if size < 0x10:
        return _FIXARRAY_HEADERS[size]
    if size < 0x10000:
        return b"\xdc" + size.to_bytes(2, "big")
    return b"\xdd" + size.to_bytes(4, "big")


def _str_header(size: int) -> bytes:
    """MessagePack: fixstr, str 8, str 16 or str 32 of ``size`` bytes."""
    if size < 0x20:
        return bytes((0xA0 | size,))
    if size < 0x100:
        return bytes((0xD9, size))
    if size < 0x10000:
        return b"\xda" + size.to_bytes(2, "big")
    return b"\xdb" + size.to_bytes(4, "big")


#: :func:`_str_header` of each size below 256 (fixstr, str 8), and :func:`array_header` of
#: each size below 16 (fixarray), made once.
_SHORT_STR_HEADERS = tuple(_str_header(size) for size in range(0x100))
_FIXARRAY_HEADERS = tuple(bytes((0x90 | size,)) for size in range(0x10))


#: The prelude of the scripts that free a name without handing it to a fair waiter.
WAKE_FAIR_WAITER = "wake_fair_waiter"


class Scripts:
    """Typed wrappers around the scripts, bound to one Redis client; with ``replication``,
    every call of a script that writes a lease waits for its replicas (renewals: the
    heartbeat's :func:`run_batch` adds the WAIT)."""

    def __init__(self, redis: Any, replication: Replication | None = None) -> None:
        self._acquire: Script = register(redis, with_fence_ttl("acquire"), replication)
        self._release: Script = register(redis, with_fence_ttl("release"), replication)
        self._renew: Script = register(redis, source("renew"))
        self._handover: Script = register(redis, source("handover"), replication)
        self._release_holder: Script = register(
            redis, source_after(WAKE_FAIR_WAITER, "release_holder"), replication
        )
        self._fair_abandon: Script = register(redis, source("fair_abandon"), replication)
        self._acquire_undo: Script = register(redis, source("acquire_undo"), replication)

    def acquire(
        self,
        lock_key: bytes,
        fence_key: bytes,
        owner: str,
        ttl_ms: int,
        max_hold_ms: int,
        holder: bytes,
        takeover: str = "",
        *,
        waiting: bool = False,
        fair_ms: int = 0,
        attempt: str = "",
    ) -> tuple[bool, int]:
        """(True, fencing token) when taken, else (False, ms until the holder's expiry).
        ``holder``: the holder's fields, packed by :func:`pack_holder`. ``takeover``: the
        owner token of a claim this acquisition may replace. ``waiting``: the caller will
        wait for a release, so a busy holder's release must publish. ``fair_ms`` > 0: it
        waits in the queue instead, registered for that long. ``attempt``: the acquire
        call's id, for :meth:`acquire_undo` (needed when ``owner`` is not the call's own)."""
        keys, args = acquire_call(
            lock_key, fence_key, owner, ttl_ms, max_hold_ms, holder, takeover, waiting, fair_ms,
            attempt,
        )  # fmt: skip
        taken, value = self._acquire(keys=keys, args=args)
        return taken == AcquireReply.ACQUIRED, int(value)

    def acquire_freeing(
        self,
        lock_key: bytes,
        fence_key: bytes,
        owner: str,
        ttl_ms: int,
        max_hold_ms: int,
        holder: bytes,
        takeover: str,
        free: tuple[bytes, str, bool],
        attempt: str = "",
    ) -> tuple[bool, int, int]:
        """One try of :meth:`acquire` that first releases another lease, ``free`` = (its lock
        key, the owner token holding it, whether to stop when another owner holds it), in
        the same round trip (not on a Redis Cluster: the keys are in two slots). The third
        item: what the release did, as :meth:`release` says (a :class:`HolderReply`); when
        it is TAKEN and stopping was asked, nothing was tried: (False, 0, TAKEN)."""
        free_key, free_owner, stop = free
        reply = self._acquire(
            keys=(lock_key, fence_key, free_key),
            args=(owner, ttl_ms, max_hold_ms, takeover,
                  "free-or-stop" if stop else "free", free_owner, holder, attempt),
        )  # fmt: skip
        return reply[0] == AcquireReply.ACQUIRED, int(reply[1]), int(reply[2])

    def release(self, lock_key: bytes, owner: str, delay_ms: int) -> int:
        """DONE released (or handed to the oldest fair waiter), GONE or TAKEN (HolderReply); a
        release a waiter waits for is published on the lock's channel (``P{T}:chan``)."""
        return int(self._release(keys=(lock_key,), args=(owner, delay_ms)))

    def acquire_undo(self, lock_key: bytes, owner: str, attempt: str) -> int:
        """Undo what the acquire call ``attempt`` of ``owner`` took (acquire_undo.lua): 2 a
        claim taken over is back, 1 it holds the name (release it), 0 nothing of its own
        (:class:`UndoReply`)."""
        return int(self._acquire_undo(keys=(lock_key,), args=(owner, attempt)))

    def fair_abandon(self, lock_key: bytes, owner: str) -> int:
        """A fair waiter gives up: its fencing token if it was handed the lease meanwhile
        (it then holds it), else 0."""
        return int(self._fair_abandon(keys=fair_abandon_keys(lock_key, owner), args=(owner,)))

    def handover(
        self, lock_key: bytes, owner: str, new_owner: str, ttl_ms: int, fields: Sequence[Any]
    ) -> int:
        """DONE handed over, GONE or TAKEN (:class:`HolderReply`)."""
        return int(self._handover(keys=(lock_key,), args=(owner, new_owner, ttl_ms, *fields)))

    def release_holder(
        self, lock_key: bytes, task_id: str, pid: int, host: str, delay_ms: int, channel: bytes
    ) -> bool:
        """Release the lock if task ``task_id`` in process ``pid`` on ``host`` holds it."""
        reply = self._release_holder(keys=(lock_key,), args=(task_id, pid, host, delay_ms, channel))
        return int(reply) == HolderReply.DONE

    def renew_call(self, leases: Sequence[tuple[bytes, str, int, int]]) -> ScriptCall:
        """The renew.lua call for (lock key, owner, ttl ms, generation) tuples, to batch
        with others."""
        keys = [key for key, _, _, _ in leases]
        args: list[Any] = []
        for _, owner, ttl_ms, gen in leases:
            args += (owner, ttl_ms, gen)
        return self._renew, keys, args


def fair_keys(base: bytes, owner: str) -> tuple[bytes, bytes, bytes]:
    """The fair-waiting keys of ``owner``: the queue, its registration, its hand-off list."""
    raw = owner.encode()
    return base + b"queue", base + b"w:" + raw, base + b"m:" + raw


def acquire_call(
    lock_key: bytes,
    fence_key: bytes,
    owner: str,
    ttl_ms: int,
    max_hold_ms: int,
    holder: bytes,
    takeover: str,
    waiting: bool,
    fair_ms: int,
    attempt: str = "",
) -> tuple[tuple[bytes, ...], tuple[Any, ...]]:
    """KEYS and ARGV of acquire.lua for one attempt (the sync and the asyncio lease's), as
    :meth:`Scripts.acquire` describes its arguments."""
    keys: tuple[bytes, ...]
    if fair_ms > 0:
        mode, keys = "fair", (lock_key, fence_key, *fair_keys(key_base(lock_key), owner))
    else:
        mode, keys = "1" if waiting else "", (lock_key, fence_key)
    return keys, (owner, ttl_ms, max_hold_ms, takeover, mode, fair_ms, holder, attempt)


def fair_abandon_keys(lock_key: bytes, owner: str) -> tuple[bytes, ...]:
    """KEYS of fair_abandon.lua: the lock hash and ``owner``'s fair-waiting keys."""
    return (lock_key, *fair_keys(key_base(lock_key), owner))


class ScriptHost(Protocol):
    """A sync or asyncio connection, as a pure script-call builder needs it: its key prefix,
    and its Redis client to register scripts on (:func:`bound_to`)."""

    @property
    def prefix(self) -> str: ...

    @property
    def redis(self) -> Any: ...


_bound: weakref.WeakKeyDictionary[Any, dict[Callable[[Any], Any], Any]] = (
    weakref.WeakKeyDictionary()
)


def bound_to(client: Any, scripts_class: Callable[[Any], T]) -> T:
    """The ``scripts_class(client.redis)`` of ``client``, made (registered) on first use:
    for lock kinds whose scripts are not in :class:`Scripts`."""
    per_client = _bound.setdefault(client, {})
    found = per_client.get(scripts_class)
    if found is None:
        found = per_client[scripts_class] = scripts_class(client.redis)
    return found


#: One script invocation: the registered script, its keys and its arguments.
ScriptCall = tuple[RedisScript, Sequence[Any], Sequence[Any]]


def run_batch(
    redis: Any, calls: Sequence[ScriptCall], replication: Replication | None = None
) -> list[Any]:
    """Run script calls in one round trip and return their replies in order.

    A single call goes straight to EVALSHA; several go through one non-transactional
    pipeline (on a Cluster, one round trip per node; each call's keys are in one slot).
    redis-py's own pipeline support would add a SCRIPT EXISTS round trip per execute, so
    NOSCRIPT (a restarted or flushed Redis) is handled here: load and run again.

    With ``replication``, the pipeline ends with ``WAIT replicas timeout`` (on a Cluster,
    one on each node the calls went to, after its calls), and a reply acknowledged by fewer
    replicas raises :class:`LockNotReplicated` (the scripts ran on the master).
    """
    if len(calls) == 1 and replication is None:
        script, keys, args = calls[0]
        return [script(keys=keys, args=args)]
    cluster = is_cluster(redis)
    for attempt in (1, 2):
        pipe = redis.pipeline(transaction=False)
        nodes: dict[str, Any] = {}  # on a Cluster, by name: the nodes the calls go to
        for script, keys, args in calls:
            # Not pipe.evalsha: a Cluster pipeline refuses it. On a Cluster, name the node, else
            # redis-py asks the server for the keys of each command (a round trip apiece);
            # the pipeline then writes once to each node.
            options = {}
            if cluster:
                node = redis.get_node_from_key(keys[0])
                nodes.setdefault(node.name, node)
                options["target_nodes"] = node
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args, **options)
        if replication is not None:
            # WAIT has no key: on a Cluster it is sent to each node by name, as the scripts
            # were, so that it waits for what that node's calls wrote.
            targets = [{"target_nodes": node} for node in nodes.values()] if cluster else [{}]
            for options in targets:
                pipe.execute_command(
                    "WAIT", replication.replicas, replication.timeout_ms, **options
                )
        replies = pipe.execute(raise_on_error=False)
        acks, replies = replies[len(calls) :], replies[: len(calls)]
        missing = [
            (s, keys[0])
            for (s, keys, _), r in zip(calls, replies, strict=True)
            if isinstance(r, NoScriptError)
        ]
        if not missing or attempt == 2:
            break
        loaded: set[tuple[int, str | None]] = set()
        for script, key in missing:
            # On a Cluster only on the node that ran it: SCRIPT LOAD on every primary fails
            # while one of them is down.
            node = redis.get_node_from_key(key) if cluster else None
            if (id(script), node and node.name) in loaded:
                continue
            loaded.add((id(script), node and node.name))
            if node is not None:
                script.sha = load_on_node(redis, script.script, node)
            else:
                script.sha = redis.script_load(script.script)
    if cluster:
        # A call the pipeline could not run while its slot is half-migrated (or that was
        # sent on with ASK to a node without the script) runs again alone, as
        # Script._on_node retries it.
        replies = [
            script(keys=keys, args=args)
            if isinstance(reply, (*SLOT_MIGRATION_ERRORS, NoScriptError))
            else reply
            for (script, keys, args), reply in zip(calls, replies, strict=True)
        ]
    for reply in (*replies, *acks):
        if isinstance(reply, Exception):
            raise reply
    if replication is not None:
        acknowledged = min(int(ack) for ack in acks)
        if acknowledged < replication.replicas:
            raise replication.failed(acknowledged, list(replies))
    return list(replies)
