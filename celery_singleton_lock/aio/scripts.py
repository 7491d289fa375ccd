"""Running the package's Lua scripts on a ``redis.asyncio`` client.

The scripts are the sync side's (registered with :func:`..scripts.register`, which only
computes their SHA); here they are sent by SHA and loaded on NOSCRIPT (a restarted or
flushed Redis), one call at a time or several in one pipeline round trip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from ..core.redis_urls import is_async_cluster
from ..core.replication import Replication
from ..core.scripts import (
    RUN_ALONE_ERRORS,
    SLOT_MIGRATION_ERRORS,
    ScriptBatch,
    ScriptCall,
    SlotMigrationRetry,
)


async def run_script(redis: Any, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """One EVALSHA of ``script``; on NOSCRIPT load it and run it again. On a Cluster slot
    being migrated, sent again until it answers, as the sync side's ``Script`` does."""
    retry = SlotMigrationRetry()
    while True:
        try:
            return await _run_once(redis, script, keys, args)
        except SLOT_MIGRATION_ERRORS as error:
            await asyncio.sleep(retry.pause_after(error))


async def _run_once(redis: Any, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    try:
        return await redis.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        script.sha = await redis.script_load(script.script)
        return await redis.evalsha(script.sha, len(keys), *keys, *args)


async def run_batch(
    redis: Any,
    calls: Sequence[ScriptCall],
    replication: Replication | None = None,
    *,
    alone: bool = False,
) -> list[Any]:
    """Run script calls in one round trip (a :class:`..core.scripts.ScriptBatch`) and return
    their replies in order; the scripts missing on the server are loaded and the batch sent
    again. With ``replication``, the round trip ends with the WAIT, as the sync
    :func:`..core.scripts.run_batch` does."""
    if len(calls) == 1 and replication is None:
        script, keys, args = calls[0]
        return [await run_script(redis, script, keys, args)]
    cluster = replication is not None and is_async_cluster(redis)
    if cluster:
        await redis.initialize()  # the slot map names the nodes (no I/O once read)
    batch = ScriptBatch(calls, replication, redis.get_node_from_key if cluster else None)
    for attempt in (1, 2):
        pipe = redis.pipeline(transaction=False)
        batch.queue(pipe)
        batch.read(await pipe.execute(raise_on_error=False))
        missing = {id(script): script for script, _ in batch.missing()}
        if not missing or attempt == 2:
            break
        for script in missing.values():
            script.sha = await redis.script_load(script.script)
    # A call the pipeline could not run while its Cluster slot is half-migrated runs again
    # alone, as run_script retries it; a replicated one with its own WAIT.
    if not alone:
        for i in batch.failed(SLOT_MIGRATION_ERRORS):
            batch.replies[i] = await run_alone(redis, calls[i], replication)
    return batch.result()


async def run_alone(redis: Any, call: ScriptCall, replication: Replication | None) -> Any:
    """The reply of a pipeline's ``call`` refused while its Cluster slot is half-migrated,
    sent again alone until it runs (:class:`SlotMigrationRetry`); a replicated one with its
    own WAIT, in a pipeline of its own (the sync side's ``run_alone``)."""
    script, keys, args = call
    if replication is None:
        return await run_script(redis, script, keys, args)
    retry = SlotMigrationRetry()
    while True:
        try:
            return (await run_batch(redis, [call], replication, alone=True))[0]
        except RUN_ALONE_ERRORS as error:
            await asyncio.sleep(retry.pause_after(error))
