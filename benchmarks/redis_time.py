"""Section ``redis-time``: Redis server time per lock, beside Redisson's scripts.

One Redis serves the locks of every worker; its single thread's time per lock is what limits a
deployment. The anchor with guarantees comparable to ours is Redisson: its lock scripts are
written out below as its Java client sends them (``RedissonLock``, ``RedissonReadLock``,
``RedissonWriteLock``: a hash with a reentrancy counter per thread, ``PEXPIRE``, ``PUBLISH`` on
unlock), run here by SHA with the arguments it passes. Server time is ``INFO commandstats``'
``evalsha`` microseconds (a script's time includes the commands it calls), the least of
several interleaved rounds (noise on a shared machine only adds time); ours against its
anchor is the median over rounds of the two measured one after the other.

- uncontended acquire+release pairs: the floor (``SET NX PX`` + compare-and-delete), redis-py's
  ``Lock``, Redisson's ``RLock``, our lease; Redisson's ``RReadWriteLock`` read and write pairs
  beside ours; our range and multi-key pairs (no anchor has them);
- one heartbeat tick renewing 1,000 leases: the server time of its script calls (one per 250
  renewals, in one round trip), each of which blocks Redis while it runs.
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from collections.abc import Callable
from typing import Any

import redis

from celery_singleton_lock import LockClient
from celery_singleton_lock.core.heartbeat import heartbeat

from .anchors import FLOOR_RELEASE
from .context import Context
from .registry import section
from .report import Table

#: RedissonLock.tryLockInnerAsync. KEYS: the lock hash; ARGV: lease ms, "<client id>:<thread>".
REDISSON_LOCK = """
if (redis.call('exists', KEYS[1]) == 0) then
  redis.call('hincrby', KEYS[1], ARGV[2], 1);
  redis.call('pexpire', KEYS[1], ARGV[1]);
  return nil;
end;
if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
  redis.call('hincrby', KEYS[1], ARGV[2], 1);
  redis.call('pexpire', KEYS[1], ARGV[1]);
  return nil;
end;
return redis.call('pttl', KEYS[1]);
"""

#: RedissonLock.unlockInnerAsync. KEYS: the lock hash, its channel; ARGV: the unlock
#: message, lease ms, the lock name of the thread.
REDISSON_UNLOCK = """
if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then
  return nil;
end;
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1);
if (counter > 0) then
  redis.call('pexpire', KEYS[1], ARGV[2]);
  return 0;
else
  redis.call('del', KEYS[1]);
  redis.call('publish', KEYS[2], ARGV[1]);
  return 1;
end;
return nil;
"""

#: RedissonBaseLock.renewExpirationAsync (the watchdog). KEYS: the lock hash; ARGV: lease
#: ms, the lock name of the thread.
REDISSON_RENEW = """
if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
  redis.call('pexpire', KEYS[1], ARGV[1]);
  return 1;
end;
return 0;
"""

#: RedissonReadLock.tryLockInnerAsync. KEYS: the lock hash, the prefix of this thread's
#: timeout keys; ARGV: lease ms, the thread's lock name, its write-lock name.
REDISSON_READ_LOCK = """
local mode = redis.call('hget', KEYS[1], 'mode');
if (mode == false) then
  redis.call('hset', KEYS[1], 'mode', 'read');
  redis.call('hset', KEYS[1], ARGV[2], 1);
  redis.call('set', KEYS[2] .. ':1', 1);
  redis.call('pexpire', KEYS[2] .. ':1', ARGV[1]);
  redis.call('pexpire', KEYS[1], ARGV[1]);
  return nil;
end;
if (mode == 'read') or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
  local ind = redis.call('hincrby', KEYS[1], ARGV[2], 1);
  local key = KEYS[2] .. ':' .. ind;
  redis.call('set', key, 1);
  redis.call('pexpire', key, ARGV[1]);
  local remainTime = redis.call('pttl', KEYS[1]);
  redis.call('pexpire', KEYS[1], math.max(remainTime, ARGV[1]));
  return nil;
end;
return redis.call('pttl', KEYS[1]);
"""

#: RedissonReadLock.unlockInnerAsync. KEYS: the lock hash, its channel, the prefix of this
#: thread's timeout keys, the prefix of every thread's; ARGV: the unlock message, the
#: thread's lock name.
REDISSON_READ_UNLOCK = """
local mode = redis.call('hget', KEYS[1], 'mode');
if (mode == false) then
  redis.call('publish', KEYS[2], ARGV[1]);
  return 1;
end;
local lockExists = redis.call('hexists', KEYS[1], ARGV[2]);
if (lockExists == 0) then
  return nil;
end;
local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1);
if (counter == 0) then
  redis.call('hdel', KEYS[1], ARGV[2]);
end;
redis.call('del', KEYS[3] .. ':' .. (counter+1));
if (redis.call('hlen', KEYS[1]) > 1) then
  local maxRemainTime = -3;
  local keys = redis.call('hkeys', KEYS[1]);
  for n, key in ipairs(keys) do
    counter = tonumber(redis.call('hget', KEYS[1], key));
    if type(counter) == 'number' then
      for i=counter, 1, -1 do
        local remainTime = redis.call('pttl', KEYS[4] .. ':' .. key .. ':rwlock_timeout:' .. i);
        maxRemainTime = math.max(remainTime, maxRemainTime);
      end;
    end;
  end;
  if maxRemainTime > 0 then
    redis.call('pexpire', KEYS[1], maxRemainTime);
    return 0;
  end;
  if mode == 'write' then
    return 0;
  end;
end;
redis.call('del', KEYS[1]);
redis.call('publish', KEYS[2], ARGV[1]);
return 1;
"""

#: RedissonWriteLock.tryLockInnerAsync. KEYS: the lock hash; ARGV: lease ms, the thread's
#: write-lock name.
REDISSON_WRITE_LOCK = """
local mode = redis.call('hget', KEYS[1], 'mode');
if (mode == false) then
  redis.call('hset', KEYS[1], 'mode', 'write');
  redis.call('hset', KEYS[1], ARGV[2], 1);
  redis.call('pexpire', KEYS[1], ARGV[1]);
  return nil;
end;
if (mode == 'write') then
  if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
    redis.call('hincrby', KEYS[1], ARGV[2], 1);
    local currentExpire = redis.call('pttl', KEYS[1]);
    redis.call('pexpire', KEYS[1], currentExpire + ARGV[1]);
    return nil;
  end;
end;
return redis.call('pttl', KEYS[1]);
"""

#: RedissonWriteLock.unlockInnerAsync. KEYS: the lock hash, its channel; ARGV: the unlock
#: message, lease ms, the thread's write-lock name.
REDISSON_WRITE_UNLOCK = """
local mode = redis.call('hget', KEYS[1], 'mode');
if (mode == false) then
  redis.call('publish', KEYS[2], ARGV[1]);
  return 1;
end;
if (mode == 'write') then
  local lockExists = redis.call('hexists', KEYS[1], ARGV[3]);
  if (lockExists == 0) then
    return nil;
  else
    local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1);
    if (counter > 0) then
      redis.call('pexpire', KEYS[1], ARGV[2]);
      return 0;
    else
      redis.call('hdel', KEYS[1], ARGV[3]);
      if (redis.call('hlen', KEYS[1]) == 1) then
        redis.call('del', KEYS[1]);
        redis.call('publish', KEYS[2], ARGV[1]);
      else
        redis.call('hset', KEYS[1], 'mode', 'read');
      end;
      return 1;
    end;
  end;
end;
return nil;
"""

LEASE_MS = 30_000
#: Redisson's unlock message (LockPubSub.UNLOCK_MESSAGE).
UNLOCK_MESSAGE = 0
#: Rounds of each measure, quick / full; each round runs every lock's pairs in turn, ours
#: right after its anchor's, so that the two meet the same moment of a shared machine.
ROUNDS = (3, 15)
PAIRS = (500, 1000)
RENEWED = 1000


class Redisson:
    """Redisson's lock scripts on one name, with the keys and arguments its client passes
    (one client id, one thread)."""

    def __init__(self, client: redis.Redis, prefix: str, name: str) -> None:
        self.name = f"{prefix}{name}"
        self.thread = f"{uuid.uuid4()}:1"
        self.channel = f"redisson_lock__channel:{{{self.name}}}"
        self.timeouts = f"{{{self.name}}}:{self.thread}:rwlock_timeout"
        self.lock = client.register_script(REDISSON_LOCK)
        self.unlock = client.register_script(REDISSON_UNLOCK)
        self.renew = client.register_script(REDISSON_RENEW)
        self.read_lock = client.register_script(REDISSON_READ_LOCK)
        self.read_unlock = client.register_script(REDISSON_READ_UNLOCK)
        self.write_lock = client.register_script(REDISSON_WRITE_LOCK)
        self.write_unlock = client.register_script(REDISSON_WRITE_UNLOCK)

    def lock_pair(self) -> None:
        assert self.lock(keys=[self.name], args=[LEASE_MS, self.thread]) is None
        assert self.unlock(
            keys=[self.name, self.channel], args=[UNLOCK_MESSAGE, LEASE_MS, self.thread]
        )

    def read_pair(self) -> None:
        write_name = f"{self.thread}:write"
        assert (
            self.read_lock(
                keys=[self.name, self.timeouts], args=[LEASE_MS, self.thread, write_name]
            )
            is None
        )
        prefix = f"{{{self.name}}}"
        assert self.read_unlock(
            keys=[self.name, self.channel, self.timeouts, prefix],
            args=[UNLOCK_MESSAGE, self.thread],
        )

    def write_pair(self) -> None:
        write_name = f"{self.thread}:write"
        assert self.write_lock(keys=[self.name], args=[LEASE_MS, write_name]) is None
        assert self.write_unlock(
            keys=[self.name, self.channel], args=[UNLOCK_MESSAGE, LEASE_MS, write_name]
        )


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--redis-time-rounds", type=int, help="rounds (3 quick, 7 full)")
    group.add_argument("--redis-time-pairs", type=int, help="pairs per round (500 / 2000)")


def evalsha_usec(client: redis.Redis, commands: tuple[str, ...] = ("evalsha",)) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in commands)


@section(
    "redis-time",
    "Redis server time per lock, beside Redisson",
    add_arguments=add_arguments,
    order=35,
)
def run(ctx: Context) -> list[Table]:
    rounds = ctx.pick("redis_time_rounds", *ROUNDS)
    pairs = ctx.pick("redis_time_pairs", *PAIRS)
    plain = ctx.redis()
    prefix = ctx.prefix("redis-time")
    client = LockClient(plain, prefix=prefix)
    redisson = Redisson(plain, prefix, "redisson")
    floor_release = plain.register_script(FLOOR_RELEASE)

    def floor_pair() -> None:
        token = uuid.uuid4().hex
        assert plain.set(f"{prefix}floor", token, nx=True, px=LEASE_MS)
        assert floor_release(keys=[f"{prefix}floor"], args=[token]) == 1

    def redis_py_pair() -> None:
        with plain.lock(f"{prefix}redis-py", timeout=LEASE_MS / 1000):
            pass

    def lease_pair() -> None:
        with client.lease("lease", ttl=LEASE_MS / 1000, heartbeat=False):
            pass

    rw = client.rwlock("rw")

    def read_pair() -> None:
        with rw.read(ttl=LEASE_MS / 1000, heartbeat=False):
            pass

    def write_pair() -> None:
        with rw.write(ttl=LEASE_MS / 1000, heartbeat=False):
            pass

    ranges = client.range_lock("range")

    def range_pair() -> None:
        with ranges.write(10, 20, ttl=LEASE_MS / 1000, heartbeat=False):
            pass

    def multi_pair() -> None:
        with client.multi(["multi-a", "multi-b"], ttl=LEASE_MS / 1000, heartbeat=False):
            pass

    # (label, pair, commands it sends itself, the anchor row it is compared with)
    measured: list[tuple[str, Callable[[], None], tuple[str, ...], str | None]] = [
        ("floor: SET NX PX + compare-and-delete", floor_pair, ("set", "evalsha"), None),
        ("redis-py Lock", redis_py_pair, ("set", "evalsha"), None),
        ("Redisson RLock (its scripts)", redisson.lock_pair, ("evalsha",), None),
        ("ours: lease", lease_pair, ("evalsha",), "Redisson RLock (its scripts)"),
        ("Redisson RReadWriteLock read", redisson.read_pair, ("evalsha",), None),
        ("ours: reader-writer read", read_pair, ("evalsha",), "Redisson RReadWriteLock read"),
        ("Redisson RReadWriteLock write", redisson.write_pair, ("evalsha",), None),
        ("ours: reader-writer write", write_pair, ("evalsha",), "Redisson RReadWriteLock write"),
        ("ours: range write [10, 20]", range_pair, ("evalsha",), None),
        ("ours: multi-key, 2 names", multi_pair, ("evalsha",), None),
    ]
    per_round: dict[str, list[float]] = {label: [] for label, *_ in measured}
    try:
        for pair in (fn for _, fn, _, _ in measured):
            pair()  # load every script once: the first call of each sends EVAL
        for _ in range(rounds):
            for label, pair, commands, _ in measured:
                before = evalsha_usec(plain, commands)
                for _ in range(pairs):
                    pair()
                per_round[label].append((evalsha_usec(plain, commands) - before) / pairs)
        pairs_table = Table(
            f"Server time per uncontended acquire+release pair (INFO commandstats, "
            f"{rounds} interleaved rounds x {pairs} pairs)",
            ["lock", "server us/pair (least)", "x anchor (median of rounds)"],
            numeric=frozenset({1, 2}),
        )
        for label, _, _, anchor in measured:
            ratio = ""
            if anchor:
                ratios = [a / b for a, b in zip(per_round[label], per_round[anchor], strict=True)]
                ratio = f"{statistics.median(ratios):.2f}"
            pairs_table.add(label, f"{min(per_round[label]):.1f}", ratio)
        pairs_table.notes.append(
            "Redisson's scripts keep a reentrancy counter per thread and no holder record "
            "or fencing token; ours keep the owner check, a fencing token, the holder record "
            "the admin lists and an expiry on every key."
        )
        pairs_table.notes.append(
            "x anchor: the median over rounds of ours over the anchor's time in the same round "
            "(measured one after the other), steadier on a shared machine than a ratio of least "
            "times"
        )
        return [pairs_table, renewal_table(ctx, rounds)]
    finally:
        plain.close()


def renewal_table(ctx: Context, rounds: int) -> Table:
    """One heartbeat tick renewing ``RENEWED`` leases: the server time of its script calls,
    all of them and per call."""
    plain = ctx.redis()
    client = LockClient(plain, prefix=ctx.prefix("redis-time-renewal"))
    beat = heartbeat()
    held = [client.lease(f"held-{i}", ttl=300, heartbeat=True) for i in range(RENEWED)]
    try:
        for lease in held:
            assert lease.acquire()
        beat.tick()  # loads the renew script on a fresh server
        worst = 0.0
        per_tick = []
        calls = 0
        for _ in range(rounds):
            before = plain.info("commandstats").get("cmdstat_evalsha", {})
            beat.tick()
            after = plain.info("commandstats").get("cmdstat_evalsha", {})
            calls = int(after.get("calls", 0)) - int(before.get("calls", 0))
            usec = int(after.get("usec", 0)) - int(before.get("usec", 0))
            per_tick.append(usec / 1000)
            worst = max(worst, usec / max(calls, 1) / 1000)
        table = Table(
            f"One heartbeat tick renewing {RENEWED} leases of one process (least of {rounds})",
            ["measure", "value"],
            numeric=frozenset({1}),
        )
        table.add("server ms per tick (all its script calls)", f"{min(per_tick):.2f}")
        table.add("script calls per tick", f"{calls}")
        table.add("ms per script call (Redis blocked that long at a time)", f"{worst:.2f}")
        table.notes.append(
            "Redisson's watchdog renews each lock with a call of its own "
            f"({RENEWED} calls a tick for {RENEWED} locks): see the renew script above."
        )
        return table
    finally:
        for lease in held:
            if lease.held:
                lease.release()
        plain.close()
