"""What the script-call tests share: scripts, a call made in a thread of its own, and
whether one waits on a paused server."""

from __future__ import annotations

import threading
from typing import Any

import redis

from celery_singleton_lock.core.scripts import Script

COUNTER = "return redis.call('INCR', KEYS[1])"
#: INCR after keeping the server busy for ARGV[1] µs.
SLOW_COUNTER = """
local t0 = redis.call('TIME')
repeat
    local t = redis.call('TIME')
until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) >= tonumber(ARGV[1])
return redis.call('INCR', KEYS[1])
"""


def call_in_thread(
    script: Script, keys: tuple[str, ...], args: tuple[Any, ...] = ()
) -> tuple[threading.Thread, list[Any]]:
    """Start ``script(keys, args)`` in a daemon thread; its reply, or what it raised, lands
    in the list."""
    outcome: list[Any] = []

    def call() -> None:
        try:
            outcome.append(script(keys=keys, args=args))
        except Exception as exc:  # the test looks at what was raised
            outcome.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread, outcome


def evalsha_postponed(admin: redis.Redis) -> bool:
    """Whether a script call waits on a paused server (``CLIENT PAUSE``): a postponed client
    is flagged blocked; an earlier call may have left other connections' last command
    EVALSHA too."""
    return any(
        entry.get("cmd") == "evalsha" and "b" in entry.get("flags", "")
        for entry in admin.client_list()
    )
