"""Code run in child processes by the lease tests (importable, so "spawn" can start it).

Every worker talks to the test over a multiprocessing ``Connection``; nothing here sleeps to
synchronise: workers block on the pipe until the test tells them what to do next.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection
from typing import Any

from celery_singleton_lock import LockClient, LockLost

#: The fencing recipe: a store that accepts a write only if its fencing token is not older
#: than the newest it has seen. KEYS[1]: the store hash; ARGV: token, field, value.
#: Returns 1 if written, 0 if rejected as stale. Tokens compare as numbers (they fit a double
#: exactly); equal tokens are accepted so one holder may write several times.
FENCED_WRITE = """
local last = redis.call('HGET', KEYS[1], 'fence_token')
if last and tonumber(last) > tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'fence_token', ARGV[1], ARGV[2], ARGV[3])
return 1
"""


def fenced_write(client: LockClient, store: str, token: int, field: str, value: str) -> bool:
    """Write ``field = value`` to the token-checking store; False if rejected as stale."""
    return bool(client.redis.eval(FENCED_WRITE, 1, store, token, field, value))


def counter_worker(url: str, prefix: str, iterations: int, go: Any, conn: Connection) -> None:
    """A NON-atomic read-modify-write of a counter under the lease, ``iterations`` times.

    Sends back (value read, fencing token) per acquisition: the value read is the global
    acquisition order, since every holder adds one.
    """
    client = LockClient.from_url(url, prefix=prefix)
    key = prefix + "counter-value"
    seen: list[tuple[int, int]] = []
    go.wait(30)
    for _ in range(iterations):
        with client.lease("counter", ttl=10, wait=30) as lease:
            value = int(client.redis.get(key) or 0)
            time.sleep(0.001)  # widen the race window a non-exclusive lock would lose
            client.redis.set(key, value + 1)
            assert lease.token is not None
            seen.append((value, lease.token))
    conn.send(seen)
    client.close()


def holder(url: str, prefix: str, name: str, ttl: float, conn: Connection) -> None:
    """Take the lease (heartbeat on), report its token, then obey the test.

    Commands: ``("write", store, value)``: report whether the lease is seen as lost and
    what ``check()`` says, then write to the fenced store with this lease's token regardless
    (a write already under way when the process was paused) and report whether it was
    accepted. ``("release",)``: release and exit.
    """
    client = LockClient.from_url(url, prefix=prefix)
    lease = client.lease(name, ttl=ttl)
    if not lease.acquire(wait=10):
        conn.send(("not acquired", None))
        return
    conn.send(("acquired", lease.token))
    while True:
        command = conn.recv()
        if command[0] == "write":
            _, store, value = command
            lost = lease.lost
            try:
                lease.check()
                check = "ok"
            except LockLost as exc:
                check = type(exc).__name__
            assert lease.token is not None
            accepted = fenced_write(client, store, lease.token, "value", value)
            conn.send({"lost": lost, "check": check, "accepted": accepted})
        elif command[0] == "release":
            lease.release()
            conn.send("released")
            return


def cpu_holder(
    url: str, prefix: str, name: str, ttl: float, seconds: float, conn: Connection
) -> None:
    """Hold a short lease while spinning in pure-Python loops (holding the GIL as much as
    Python lets one thread), then report whether the lease survived."""
    from celery_singleton_lock.core.heartbeat import heartbeat

    client = LockClient.from_url(url, prefix=prefix)
    lease = client.lease(name, ttl=ttl)
    assert lease.acquire(wait=10)
    conn.send(("acquired", lease.token))
    ticks = heartbeat().ticks
    end = time.monotonic() + seconds
    total = 0
    while time.monotonic() < end:
        total += sum(i * i for i in range(2000))
    result: dict[str, Any] = {"held": lease.held, "ticks": heartbeat().ticks - ticks}
    try:
        lease.check()
        result["check"] = "ok"
    except LockLost as exc:
        result["check"] = type(exc).__name__
    lease.release()
    result["total"] = total
    conn.send(result)
    client.close()
