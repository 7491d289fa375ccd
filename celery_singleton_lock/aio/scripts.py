"""Running the package's Lua scripts on a ``redis.asyncio`` client.

The scripts are the sync side's (registered with :func:`..scripts.register`, which only
computes their SHA); here they are sent by SHA and loaded on NOSCRIPT (a restarted or
flushed Redis), one call at a time or several in one pipeline round trip.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from ..core.scripts import (
    SLOT_MIGRATION_BACKOFF,
    SLOT_MIGRATION_ERRORS,
    SLOT_MIGRATION_RETRY,
    WAKE_FAIR_WAITER,
    ScriptCall,
    register,
    source,
    source_after,
    with_fence_ttl,
)


async def run_script(redis: Any, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """One EVALSHA of ``script``; on NOSCRIPT load it and run it again. On a Cluster slot
    being migrated, sent again until it answers, as the sync side's ``Script`` does."""
    deadline = time.monotonic() + SLOT_MIGRATION_RETRY
    while True:
        try:
            return await _run_once(redis, script, keys, args)
        except SLOT_MIGRATION_ERRORS:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(SLOT_MIGRATION_BACKOFF)


async def _run_once(redis: Any, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    try:
        return await redis.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        script.sha = await redis.script_load(script.script)
        return await redis.evalsha(script.sha, len(keys), *keys, *args)


async def run_batch(redis: Any, calls: Sequence[ScriptCall]) -> list[Any]:
    """Run script calls in one round trip (a non-transactional pipeline) and return their
    replies in order; the scripts missing on the server are loaded and the batch sent again."""
    if len(calls) == 1:
        script, keys, args = calls[0]
        return [await run_script(redis, script, keys, args)]
    for attempt in (1, 2):
        pipe = redis.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        replies = await pipe.execute(raise_on_error=False)
        missing = {
            id(script): script
            for (script, _, _), reply in zip(calls, replies, strict=True)
            if isinstance(reply, NoScriptError)
        }
        if not missing or attempt == 2:
            break
        for script in missing.values():
            script.sha = await redis.script_load(script.script)
    # A call the pipeline could not run while its Cluster slot is half-migrated runs again
    # alone, as run_script retries it.
    replies = [
        await run_script(redis, script, keys, args)
        if isinstance(reply, SLOT_MIGRATION_ERRORS)
        else reply
        for (script, keys, args), reply in zip(calls, replies, strict=True)
    ]
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return list(replies)


class LeaseScripts:
    """The lease scripts an async client calls directly, registered once (no I/O). Interval
    and multi-key scripts come from their sync modules' registries (``bound_to``)."""

    def __init__(self, redis: Any) -> None:
        self.acquire = register(redis, with_fence_ttl("acquire"))
        self.release = register(redis, with_fence_ttl("release"))
        self.clear = register(redis, source_after(WAKE_FAIR_WAITER, "clear"))
        self.fair_abandon = register(redis, source("fair_abandon"))
        self.release_holder = register(redis, source_after(WAKE_FAIR_WAITER, "release_holder"))
