"""Server time per acquire+release pair, from ``INFO commandstats``.

Counters are read before and after the pairs and subtracted (nothing is reset, so a shared
``REDIS_URL`` is left alone, though its other clients' commands then count too). Only the
commands a lock sends itself are summed: a script's time includes the commands it calls,
which ``commandstats`` also counts under their own names, so ours sum ``evalsha`` alone and
the floor ``set`` + ``evalsha`` (its script calls no ``SET``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

#: What each lock sends to the server itself, per benchmark key.
TOP_LEVEL: dict[str, tuple[str, ...]] = {
    "floor": ("set", "evalsha"),
    "redis-py": ("set", "evalsha"),
    "ours": ("evalsha",),
}
#: Rounds per measure; the least is kept (noise on a shared machine only adds time).
ROUNDS = 3


def usec(client: Any, commands: Sequence[str]) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in commands)


def server_us_per_pair(
    client: Any, pair: Callable[[], None], commands: Sequence[str], pairs: int, rounds: int = ROUNDS
) -> float:
    """Microseconds of server time per ``pair()``: the least of ``rounds`` rounds."""
    best = float("inf")
    for _ in range(rounds):
        before = usec(client, commands)
        for _ in range(pairs):
            pair()
        best = min(best, (usec(client, commands) - before) / pairs)
    return best
