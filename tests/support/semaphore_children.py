"""Code run in child processes by the semaphore tests (importable, so "spawn" can start it)."""

from __future__ import annotations

import time
from multiprocessing.connection import Connection
from typing import Any

from celery_singleton_lock import LockClient


def permit_worker(
    url: str, prefix: str, name: str, limit: int, rounds: int, go: Any, conn: Connection
) -> None:
    """Take a permit of semaphore ``name`` ``rounds`` times; under each, count this holder
    in a Redis counter of holders in at once (INCR, a moment of work, DECR). Reports the
    largest count it saw and the fencing tokens it got."""
    client = LockClient.from_url(url, prefix=prefix)
    inside = f"{prefix}inside:{name}"
    most, tokens = 0, []
    go.wait(30)
    for _ in range(rounds):
        with client.semaphore(name, limit).permit(ttl=10, wait=60) as permit:
            most = max(most, int(client.redis.incr(inside)))
            time.sleep(0.005)  # work while holding: lets the others pile up
            tokens.append(permit.token)
            client.redis.decr(inside)
    conn.send({"most": most, "tokens": tokens})
    client.close()
