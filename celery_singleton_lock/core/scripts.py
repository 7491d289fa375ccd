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

from .keys import key_base
from .redis_urls import is_async_cluster, is_cluster
from .replication import Replication

T = TypeVar("T")

SCRIPT_NAMES = (
    "acquire",
    "acquire_undo",
    "release",
    "renew",
    "handover",
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
        #: :func:`joined` scripts made from this one, by the other script's SHA.
        self.joined_with: dict[str, Script] = {}

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
        retry = SlotMigrationRetry()
        while True:
            try:
                return self._once_on_node(client, keys, args)
            except SLOT_MIGRATION_ERRORS as error:
                time.sleep(retry.pause_after(error))

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


#: The text of :func:`joined`: each script's text becomes a function of its own keys and
#: arguments (a chunk's top-level ``return`` ends its function), run one after the other;
#: ARGV[1] and ARGV[2] say how many of the keys and arguments are the first script's.
JOINED_HEAD = """\
local function first_script(KEYS, ARGV)
"""
JOINED_MIDDLE = """
end
local function second_script(KEYS, ARGV)
"""
JOINED_TAIL = """
end
-- items[from..to] as a table of its own. unpack copies them in C, which saves a task's two
-- calls about 2.5 µs of server time against a loop, but stops at Lua's stack limit (8,000
-- values), which a lock of many names could pass: a loop copies those.
local function slice(items, from, to)
  if to - from < 4000 then
    return {unpack(items, from, to)}
  end
  local copy = {}
  for i = from, to do
    copy[i - from + 1] = items[i]
  end
  return copy
end
local key_count, arg_count = tonumber(ARGV[1]), tonumber(ARGV[2])
local first = first_script(slice(KEYS, 1, key_count), slice(ARGV, 3, arg_count + 2))
local second = second_script(slice(KEYS, key_count + 1, #KEYS), slice(ARGV, arg_count + 3, #ARGV))
return {first or false, second or false}
"""


def joined(first: RedisScript, second: RedisScript) -> Script:
    """One script that runs ``first`` and then ``second``, each on its own keys and
    arguments (all in one Cluster slot), in one call: :func:`joined_call` builds its call,
    its reply is both scripts' replies (None for a script that returned nothing). Made once
    per pair, bound to ``first``'s client (and replication); no I/O.

    So that a script another layer needs beside a lock's own (the Celery layer's done mark)
    costs no second call: a pipeline of two calls costs the client several times the Python
    of one, and leaves the two not atomic."""
    assert isinstance(first, Script), first
    made = first.joined_with.get(second.sha)
    if made is None:
        head, tail = first.script, second.script
        assert isinstance(head, str) and isinstance(tail, str)
        text = JOINED_HEAD + head + JOINED_MIDDLE + tail + JOINED_TAIL
        # Not register(): the two texts are already as the client needs them (sharded).
        made = first.joined_with[second.sha] = Script(
            first.registered_client, text, first.replication
        )
    return made


def joined_call(first: ScriptCall, second: ScriptCall) -> ScriptCall:
    """The call of :func:`joined` that makes the calls ``first`` and ``second``."""
    (script, keys, args), (other, other_keys, other_args) = first, second
    return (
        joined(script, other),
        (*keys, *other_keys),
        (len(keys), len(args), *args, *other_args),
    )


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


class SlotMigrationRetry:
    """When a script call that failed with one of :data:`SLOT_MIGRATION_ERRORS` is sent
    again: after :data:`SLOT_MIGRATION_BACKOFF`, until :data:`SLOT_MIGRATION_RETRY` has
    passed since the first try (made when this is). For the sync ``Script`` and the asyncio
    ``run_script``."""

    def __init__(self) -> None:
        self._deadline = time.monotonic() + SLOT_MIGRATION_RETRY

    def pause_after(self, error: Exception) -> float:
        """Seconds to wait before the next try after the failed try's ``error``; ``error``
        raised once the time is up."""
        if time.monotonic() >= self._deadline:
            raise error
        return SLOT_MIGRATION_BACKOFF


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


#: The prelude of the scripts that touch keys they do not name (lua/advisory.lua).
ADVISORY = "advisory"
#: The prelude of every script that reads the server's clock (before FENCING, which does).
CLOCK = "clock"
#: The prelude of the scripts that free a hold now and leave its trace (after ADVISORY).
TRACE = "trace"
#: The preludes of the scripts that free a name without handing it to a fair waiter.
WAKE_FAIR_WAITER = (ADVISORY, "wake_fair_waiter")


class Scripts:
    """The lease scripts registered on one Redis client, and a typed builder of each one's
    :data:`ScriptCall` (run by :func:`run`, :func:`run_batch` or a handle's runner); with
    ``replication``, every call of a script that writes a lease waits for its replicas
    (renewals: the heartbeat's :func:`run_batch` adds the WAIT)."""

    def __init__(self, redis: Any, replication: Replication | None = None) -> None:
        self._acquire: Script = register(
            redis, source_after(CLOCK, FENCING, ADVISORY, "acquire"), replication
        )
        self._release: Script = register(
            redis, source_after(CLOCK, FENCING, *WAKE_FAIR_WAITER, TRACE, "release"), replication
        )
        self._renew: Script = register(redis, source_after(CLOCK, ADVISORY, "renew_hold", "renew"))
        self._handover: Script = register(redis, source("handover"), replication)
        self._fair_abandon: Script = register(redis, source("fair_abandon"), replication)
        self._acquire_undo: Script = register(
            redis, source_after(ADVISORY, "acquire_undo"), replication
        )

    def acquire_call(
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
        free: tuple[bytes, str, bool] | None = None,
    ) -> ScriptCall:
        """The acquire.lua call of one attempt; its reply, read by ``replies.acquire_outcome``,
        is (a Reply: DONE or BUSY, fencing token when taken, else ms until the holder's expiry).
        ``holder``: the holder's fields, packed by :func:`pack_holder`. ``takeover``: the
        owner token of a claim this acquisition may replace. ``waiting``: the caller will
        wait for a release, so a busy holder's release must publish. ``fair_ms`` > 0: it
        waits in the queue instead, registered for that long. ``attempt``: the acquire
        call's id, for :meth:`acquire_undo_call` (needed when ``owner`` is not the call's
        own).

        ``free`` = (a lock key, the owner token holding it, whether to stop when another
        owner holds it): a single try (neither waiting nor fair) that first releases that
        other lease in the same round trip (not on a Redis Cluster: the keys are in two
        slots); the reply's third item is what the release did (Reply), and when it
        found TAKEN and stopping was asked, nothing was tried: (BUSY, 0, TAKEN)."""
        keys: tuple[bytes, ...] = (lock_key, fence_key)
        mode_arg: Any = fair_ms
        if free is not None:
            free_key, mode_arg, stop = free
            keys, mode = (*keys, free_key), "free-or-stop" if stop else "free"
        elif fair_ms > 0:
            keys, mode = (*keys, *fair_keys(key_base(lock_key), owner)), "fair"
        else:
            mode = "1" if waiting else ""
        args = (owner, ttl_ms, max_hold_ms, takeover, mode, mode_arg, holder, attempt)
        return self._acquire, keys, args

    def release_call(
        self, lock_key: bytes, owner: str, delay_ms: int, token: int | None = None
    ) -> ScriptCall:
        """The release.lua call: its reply is DONE released (or handed to the oldest fair
        waiter), GONE or TAKEN (Reply); a release a waiter waits for is published on
        the lock's channel (``P{T}:chan``). With the hold's fencing ``token``, the same call
        sent again after its reply was lost answers DONE too."""
        return self._release, (lock_key,), (owner, delay_ms, "" if token is None else token)

    def acquire_undo_call(self, lock_key: bytes, owner: str, attempt: str) -> ScriptCall:
        """The acquire_undo.lua call: undo what the acquire call ``attempt`` of ``owner`` took;
        its reply is CLAIM_RESTORED a claim taken over is back, HELD it holds the name
        (release it), GONE nothing of its own (:class:`Reply`)."""
        return self._acquire_undo, (lock_key,), (owner, attempt)

    def fair_abandon_call(self, lock_key: bytes, owner: str) -> ScriptCall:
        """The fair_abandon.lua call of a fair waiter giving up: its reply is its fencing
        token if it was handed the lease meanwhile (it then holds it), else 0."""
        return self._fair_abandon, (lock_key, *fair_keys(key_base(lock_key), owner)), (owner,)

    def handover_call(
        self, lock_key: bytes, owner: str, new_owner: str, ttl_ms: int, fields: Sequence[Any]
    ) -> ScriptCall:
        """The handover.lua call: its reply is DONE handed over, GONE or TAKEN
        (:class:`Reply`)."""
        return self._handover, (lock_key,), (owner, new_owner, ttl_ms, *fields)

    def clear_call(self, lock_key: bytes, token: str, renewed_ms: str) -> ScriptCall:
        """The release.lua call of the admin's clear of the holder (or release delay) listed
        with fencing ``token``, only if it was not renewed since ``renewed_ms`` ('' not
        checked): its reply is DONE cleared, GONE, TAKEN or RESUMED (:class:`Reply`)."""
        return self._release, (lock_key,), ("", 0, token, "clear", renewed_ms)

    def release_holder_call(
        self, lock_key: bytes, task_id: str, pid: int, host: str, delay_ms: int, proc: str
    ) -> ScriptCall:
        """The release.lua call of a supervisor: release the lock if task ``task_id`` in
        process ``pid`` on ``host`` holds it (with a process mark that begins with ``proc``,
        when the hold has one and ``proc`` is not ''); its reply is DONE released or GONE
        (Reply)."""
        args = ("", delay_ms, "", "holder", "", task_id, pid, host, proc)
        return self._release, (lock_key,), args

    def renew_call(self, leases: Sequence[tuple[bytes, str, int, int]]) -> ScriptCall:
        """The renew.lua call for (lock key, owner, ttl ms, generation) tuples, to batch
        with others."""
        keys = [key for key, _, _, _ in leases]
        args: list[Any] = []
        for _, owner, ttl_ms, gen in leases:
            args += (owner, ttl_ms, gen)
        return self._renew, keys, args


def run(call: ScriptCall) -> Any:
    """Run one script call (its script on the client it was registered on); its reply."""
    script, keys, args = call
    return script(keys=keys, args=args)


def fair_keys(base: bytes, owner: str) -> tuple[bytes, bytes, bytes]:
    """The fair-waiting keys of ``owner``: the queue, its registration, its hand-off list."""
    raw = owner.encode()
    return base + b"queue", base + b"w:" + raw, base + b"m:" + raw


class ScriptHost(Protocol):
    """A sync or asyncio connection, as a pure script-call builder needs it: its key prefix,
    its Redis client to register scripts on (:func:`bound_to`), how many replicas its lock
    writes wait for, and its lease scripts (:class:`Scripts`)."""

    @property
    def prefix(self) -> str: ...

    @property
    def redis(self) -> Any: ...

    @property
    def replication(self) -> Replication | None: ...

    @property
    def scripts(self) -> Scripts: ...


_bound: weakref.WeakKeyDictionary[Any, dict[Callable[[Any, Any], Any], Any]] = (
    weakref.WeakKeyDictionary()
)


def bound_to(client: Any, scripts_class: Callable[[Any, Replication | None], T]) -> T:
    """The ``scripts_class(client.redis, client.replication)`` of ``client``, made
    (registered) on first use: for lock kinds whose scripts are not in :class:`Scripts`.
    Their writes wait for the client's replicas as the lease's do."""
    per_client = _bound.setdefault(client, {})
    found = per_client.get(scripts_class)
    if found is None:
        found = per_client[scripts_class] = scripts_class(client.redis, client.replication)
    return found


#: One script invocation: the registered script, its keys and its arguments.
ScriptCall = tuple[RedisScript, Sequence[Any], Sequence[Any]]


class ScriptBatch:
    """Script calls sent in one non-transactional pipeline, without I/O: what the pipeline
    carries, which scripts a reply says are missing on the server, and what the replies
    come to. :func:`run_batch` and the asyncio ``run_batch`` send it and load the scripts.

    ``node_of`` (a Cluster client's ``get_node_from_key``, else None): each call is sent to
    the node of its first key by name, else redis-py asks the server for the keys of each
    command (a round trip apiece); the pipeline then writes once to each node.

    With ``replication``, the pipeline ends with ``WAIT replicas timeout`` (on a Cluster,
    one on each node the calls went to, after its calls), and a reply acknowledged by fewer
    replicas raises :class:`LockNotReplicated` (the scripts ran on the master)."""

    def __init__(
        self,
        calls: Sequence[ScriptCall],
        replication: Replication | None,
        node_of: Callable[[Any], Any] | None = None,
    ) -> None:
        self.calls = calls
        self.replication = replication
        self._node_of = node_of
        #: The calls' replies (an exception where one failed), once :meth:`read`.
        self.replies: list[Any] = []
        self._acks: list[Any] = []

    def queue(self, pipe: Any) -> None:
        """Put the calls (and the WAITs) on the pipeline ``pipe``."""
        nodes: dict[str, Any] = {}  # on a Cluster, by name: the nodes the calls go to
        for script, keys, args in self.calls:
            # Not pipe.evalsha: a Cluster pipeline refuses it.
            options = {}
            if self._node_of is not None:
                node = self._node_of(keys[0])
                nodes.setdefault(node.name, node)
                options["target_nodes"] = node
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args, **options)
        if self.replication is not None:
            # WAIT has no key: on a Cluster it is sent to each node by name, as the scripts
            # were, so that it waits for what that node's calls wrote on that connection.
            targets = [{"target_nodes": node} for node in nodes.values()]
            for options in targets if self._node_of is not None else [{}]:
                pipe.execute_command(
                    "WAIT", self.replication.replicas, self.replication.timeout_ms, **options
                )

    def read(self, replies: Sequence[Any]) -> None:
        """Take the pipeline's ``replies`` (``raise_on_error=False``)."""
        count = len(self.calls)
        self.replies, self._acks = list(replies[:count]), list(replies[count:])

    def missing(self) -> list[tuple[RedisScript, Any]]:
        """Each script a reply says is not loaded, with the Cluster node that said so (None
        off a Cluster), once each: load it there (SCRIPT LOAD on every primary fails while
        one of them is down) and send the batch again."""
        found: dict[tuple[int, str | None], tuple[RedisScript, Any]] = {}
        for (script, keys, _), reply in zip(self.calls, self.replies, strict=True):
            if isinstance(reply, NoScriptError):
                node = None if self._node_of is None else self._node_of(keys[0])
                found.setdefault((id(script), node and node.name), (script, node))
        return list(found.values())

    def failed(self, errors: tuple[type[Exception], ...]) -> list[int]:
        """The indexes of the calls whose reply is one of ``errors``: to run again alone."""
        return [i for i, reply in enumerate(self.replies) if isinstance(reply, errors)]

    def result(self) -> list[Any]:
        """The calls' replies in order; the first error among them (or the WAITs) raised,
        or :class:`LockNotReplicated` when fewer replicas acknowledged than asked."""
        for reply in (*self.replies, *self._acks):
            if isinstance(reply, Exception):
                raise reply
        if self.replication is not None:
            acknowledged = min(int(ack) for ack in self._acks)
            if acknowledged < self.replication.replicas:
                raise self.replication.failed(acknowledged, list(self.replies))
        return list(self.replies)


def run_batch(
    redis: Any,
    calls: Sequence[ScriptCall],
    replication: Replication | None = None,
    *,
    alone: bool = False,
) -> list[Any]:
    """Run script calls in one round trip and return their replies in order.

    A single call goes straight to EVALSHA; several go through one :class:`ScriptBatch`
    (on a Cluster, one round trip per node; each call's keys are in one slot). redis-py's
    own pipeline support would add a SCRIPT EXISTS round trip per execute, so NOSCRIPT (a
    restarted or flushed Redis) is handled here: load and run again. ``alone``: this is
    :func:`run_alone`'s try, which sends the call again itself.
    """
    if len(calls) == 1 and replication is None:
        script, keys, args = calls[0]
        return [script(keys=keys, args=args)]
    cluster = is_cluster(redis)
    batch = ScriptBatch(calls, replication, redis.get_node_from_key if cluster else None)
    for attempt in (1, 2):
        pipe = redis.pipeline(transaction=False)
        batch.queue(pipe)
        batch.read(pipe.execute(raise_on_error=False))
        missing = batch.missing()
        if not missing or attempt == 2:
            break
        for script, node in missing:
            if node is not None:
                script.sha = load_on_node(redis, script.script, node)
            else:
                script.sha = redis.script_load(script.script)
    if cluster and not alone:
        # A call the pipeline could not run while its slot is half-migrated (or that was
        # sent on with ASK to a node without the script) runs again alone.
        for i in batch.failed(RUN_ALONE_ERRORS):
            batch.replies[i] = run_alone(redis, calls[i], replication)
    return batch.result()


#: What a Cluster pipeline's call is sent again alone after (see :func:`run_batch`).
RUN_ALONE_ERRORS = (*SLOT_MIGRATION_ERRORS, NoScriptError)


def run_alone(redis: Any, call: ScriptCall, replication: Replication | None) -> Any:
    """The reply of a Cluster pipeline's ``call`` refused while its slot is half-migrated,
    sent again alone until it runs (:class:`SlotMigrationRetry`), as ``Script._on_node``
    sends one; a replicated one with its own WAIT, in a pipeline of its own."""
    script, keys, args = call
    if replication is None:
        return script(keys=keys, args=args)
    retry = SlotMigrationRetry()
    while True:
        try:
            return run_batch(redis, [call], replication, alone=True)[0]
        except RUN_ALONE_ERRORS as error:
            time.sleep(retry.pause_after(error))
