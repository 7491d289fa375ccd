"""The Lua scripts, loaded from ``lua/*.lua`` and registered once per Redis client.

Registering does no I/O; redis-py calls each script by SHA and loads it on NOSCRIPT
(after a restart or ``SCRIPT FLUSH``), also inside pipelines.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import NoScriptError

from .deployment import is_cluster

if TYPE_CHECKING:
    from redis.commands.core import Script

T = TypeVar("T")

SCRIPT_NAMES = ("acquire", "release", "renew", "handover", "release_holder")

#: Codes shared by release.lua and renew.lua.
GONE = 0
TAKEN = -1
MAX_HOLD_REACHED = -2


@cache
def source(name: str) -> str:
    """The text of ``lua/<name>.lua`` from the installed package."""
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text("utf-8")


class Scripts:
    """Typed wrappers around the scripts, bound to one Redis client."""

    def __init__(self, redis: Any) -> None:
        self._acquire: Script = redis.register_script(source("acquire"))
        self._release: Script = redis.register_script(source("release"))
        self._renew: Script = redis.register_script(source("renew"))
        self._handover: Script = redis.register_script(source("handover"))
        self._release_holder: Script = redis.register_script(source("release_holder"))

    def acquire(
        self,
        lock_key: bytes,
        fence_key: bytes,
        owner: str,
        ttl_ms: int,
        max_hold_ms: int,
        fence_ttl_ms: int,
        holder_fields: Sequence[Any],
        takeover: str = "",
    ) -> tuple[bool, int]:
        """(True, fencing token) when taken, else (False, ms until the holder's expiry).
        ``takeover``: the owner token of a claim this acquisition may replace."""
        taken, value = self._acquire(
            keys=(lock_key, fence_key),
            args=(owner, ttl_ms, max_hold_ms, fence_ttl_ms, takeover, *holder_fields),
        )
        return bool(taken), int(value)

    def release(self, lock_key: bytes, owner: str, delay_ms: int, channel: bytes) -> int:
        """1 released, GONE or TAKEN."""
        return int(self._release(keys=(lock_key,), args=(owner, delay_ms, channel)))

    def handover(
        self, lock_key: bytes, owner: str, new_owner: str, ttl_ms: int, fields: Sequence[Any]
    ) -> int:
        """1 handed over, GONE or TAKEN."""
        return int(self._handover(keys=(lock_key,), args=(owner, new_owner, ttl_ms, *fields)))

    def release_holder(
        self, lock_key: bytes, task_id: str, pid: int, delay_ms: int, channel: bytes
    ) -> bool:
        """Release the lock if task ``task_id`` in process ``pid`` holds it."""
        reply = self._release_holder(keys=(lock_key,), args=(task_id, pid, delay_ms, channel))
        return bool(reply)

    def renew_call(self, leases: Sequence[tuple[bytes, str, int]]) -> ScriptCall:
        """The renew.lua call for (lock key, owner, ttl ms) triples, to batch with others."""
        keys = [key for key, _, _ in leases]
        args: list[Any] = []
        for _, owner, ttl_ms in leases:
            args += (owner, ttl_ms)
        return self._renew, keys, args


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
ScriptCall = tuple["Script", Sequence[Any], Sequence[Any]]


def run_batch(redis: Any, calls: Sequence[ScriptCall]) -> list[Any]:
    """Run script calls in one round trip and return their replies in order.

    A single call goes straight to EVALSHA; several go through one non-transactional
    pipeline (on a Cluster, one round trip per node; each call's keys are in one slot).
    redis-py's own pipeline support would add a SCRIPT EXISTS round trip per execute, so
    NOSCRIPT (a restarted or flushed Redis) is handled here: load and run again.
    """
    if len(calls) == 1:
        script, keys, args = calls[0]
        return [script(keys=keys, args=args)]
    cluster = is_cluster(redis)
    for attempt in (1, 2):
        pipe = redis.pipeline(transaction=False)
        for script, keys, args in calls:
            # Not pipe.evalsha: a Cluster pipeline refuses it. On a Cluster, name the node, else
            # redis-py asks the server for the keys of each command (a round trip apiece);
            # the pipeline then writes once to each node.
            options = {"target_nodes": redis.get_node_from_key(keys[0])} if cluster else {}
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args, **options)
        replies = pipe.execute(raise_on_error=False)
        missing = [
            s for (s, _, _), r in zip(calls, replies, strict=True) if isinstance(r, NoScriptError)
        ]
        if not missing or attempt == 2:
            break
        for script in {id(s): s for s in missing}.values():
            script.sha = redis.script_load(script.script)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return list(replies)
