"""What a released hold leaves behind (trace.lua): of every kind, only the small trace that
answers the same release sent again after a lost reply (the hold's owner or state, its
token), for no longer than the hold had left, and the fencing counter for its slack."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest

from celery_singleton_lock import LockClient
from celery_singleton_lock.exceptions import LockExpired

#: The fields a trace may keep: what a release or clear sent again reads.
TRACE_FIELDS = {b"owner", b"token", b"state", b"cleared"}
TTL = 30.0

Use = Callable[[LockClient, str], AbstractContextManager[object]]
USES: dict[str, Use] = {
    "lease": lambda c, n: c.lease(n, ttl=TTL),
    "read": lambda c, n: c.rwlock(n).read(ttl=TTL),
    "upgradable": lambda c, n: c.rwlock(n).upgradable(ttl=TTL),
    "write": lambda c, n: c.rwlock(n).write(ttl=TTL),
    "range-read": lambda c, n: c.range_lock(n).read(0, 99, ttl=TTL),
    "range-write": lambda c, n: c.range_lock(n).write(0, 99, ttl=TTL),
    "permit": lambda c, n: c.semaphore(n, 3).permit(ttl=TTL),
    "multi": lambda c, n: c.multi([f"{n}-a", f"{n}-b"], ttl=TTL),
}


def keys_left(client: LockClient, name: str) -> dict[bytes, tuple[bytes, int]]:
    """Every key under the client's prefix whose name holds ``name``: its type and PTTL."""
    found = {}
    for key in client.redis.scan_iter(match=f"{client.connection.prefix}*{name}*"):
        found[key] = (client.redis.type(key), client.redis.pttl(key))
    return found


@pytest.mark.parametrize("kind", USES)
def test_a_released_hold_leaves_only_its_trace_and_counter(
    kind: str, lock_client: LockClient
) -> None:
    name = f"traced-{kind}"
    with USES[kind](lock_client, name):
        pass
    left = keys_left(lock_client, name)
    traces = {k: v for k, v in left.items() if not k.endswith(b":fence")}
    counters = {k: v for k, v in left.items() if k.endswith(b":fence")}
    names = 2 if kind == "multi" else 1
    assert len(traces) == names and len(counters) == names, left
    for key, (type_, pttl) in traces.items():
        assert type_ == b"hash"
        assert set(lock_client.redis.hgetall(key)) <= TRACE_FIELDS
        assert 0 < pttl <= TTL * 1000
        assert lock_client.redis.memory_usage(key, samples=0) < 300
    for _, (type_, pttl) in counters.items():
        assert type_ == b"string" and 0 < pttl <= 10_000


def test_a_cleared_hold_leaves_a_trace_that_says_so(lock_client: LockClient) -> None:
    hold = lock_client.rwlock("traced-clear").read(ttl=TTL, heartbeat=False)
    hold.acquire()
    assert lock_client.clear("traced-clear", force=True)
    (trace,) = (k for k in keys_left(lock_client, "traced-clear") if b":h:" in k)
    assert lock_client.redis.hgetall(trace) == {
        b"state": b"released",
        b"token": str(hold.token).encode(),
        b"cleared": b"1",
    }
    with pytest.raises(LockExpired):  # the holder finds it lost, not released
        hold.release()
