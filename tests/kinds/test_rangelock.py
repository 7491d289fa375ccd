"""Range locks: the overlap matrix, shrink, nested writes, writer reservations, crashes."""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from typing import Any

import pytest
from support.attempts import try_acquire
from support.kind_children import killable_holder
from support.waiting import wait_for

from celery_singleton_lock import ConfigurationError, LockClient, LockError
from celery_singleton_lock.embedded import RedisServer
from celery_singleton_lock.kinds import rangelock

COMPATIBLE = {("r", "r"), ("r", "u"), ("u", "r")}
#: Requested intervals against a held [10, 20]: (request, overlaps?)
GEOMETRY = [
    ((12, 15), True),  # inside
    ((0, 30), True),  # around
    ((5, 10), True),  # touches the low end: closed intervals overlap there
    ((20, 25), True),  # touches the high end
    ((0, 9.999), False),
    ((20.001, 99), False),
    ((-math.inf, 9), False),
    ((21, math.inf), False),
    ((-math.inf, math.inf), True),
]


def make(lock: Any, mode: str, lo: float, hi: float, **options: Any) -> Any:
    return {"r": lock.read, "u": lock.upgradable, "w": lock.write}[mode](lo, hi, **options)


@pytest.mark.parametrize("held", ["r", "u", "w"])
@pytest.mark.parametrize("asked", ["r", "u", "w"])
def test_overlap_matrix(lock_client: LockClient, held: str, asked: str) -> None:
    lock = lock_client.range_lock("matrix")
    holder = make(lock, held, 10, 20)
    assert holder.acquire()
    for (lo, hi), overlaps in GEOMETRY:
        handle = make(lock, asked, lo, hi)
        expected = not overlaps or (held, asked) in COMPATIBLE
        assert handle.acquire() is expected, (held, asked, lo, hi)
        if expected:
            handle.release()
    holder.release()


def test_holds_conflict_only_with_overlapping_neighbours(lock_client: LockClient) -> None:
    lock = lock_client.range_lock("many")
    writers = [lock.write(i, i + 0.5) for i in range(200)]
    assert all(w.acquire() for w in writers)
    readers = [lock.read(i + 0.6, i + 0.9) for i in range(200)]
    assert all(r.acquire() for r in readers)
    assert not lock.read(57.5, 57.55).acquire()
    assert not lock.write(99.7, 99.8).acquire()
    assert lock.read(99.7, 99.8).acquire()
    gap = lock.write(150.51, 150.59)
    assert gap.acquire()
    gap.release()


def test_shrink_frees_exactly_the_released_part(lock_client: LockClient) -> None:
    lock = lock_client.range_lock("shrink")
    held = lock.write(0, 10)
    assert held.acquire()
    woken = threading.Event()
    waiter = lock.read(8, 9, wait=20)
    thread = threading.Thread(target=lambda: waiter.acquire() and woken.set())
    thread.start()
    time.sleep(0.2)  # let it block (nothing to await: it is inside acquire)
    shrunk = time.monotonic()
    held.shrink(3, 6)
    assert woken.wait(10)
    assert time.monotonic() - shrunk < 1.0  # woken by the shrink, not by the 30 s lease
    thread.join()
    assert (held.lo, held.hi) == (3, 6)
    for lo, hi in [(0, 2.99), (6.01, 10), (2, 3), (6, 7), (4, 5)]:
        probe = lock.read(lo, hi)
        assert probe.acquire() is (lo > 6 or hi < 3), (lo, hi)
        if probe.held:
            probe.release()
    with pytest.raises(ConfigurationError):
        held.shrink(2, 6)  # growing is refused
    with pytest.raises(ConfigurationError):
        held.shrink(5, 4)
    held.shrink(4, 4)
    assert lock.write(5, 7).acquire()  # the waiter still reads [8, 9]
    assert not lock.write(3, 4).acquire()
    held.release()


def test_holds_up_to_infinity_overlap_and_shrink_like_any_other(lock_client: LockClient) -> None:
    # A hold whose hi is +inf keeps no entry in its mode's hi index (it counts in no query
    # of it); overlaps, a nested write and shrinking to a finite hi still see [lo, +inf].
    lock = lock_client.range_lock("open")
    up = lock.upgradable(5, math.inf, heartbeat=False)
    assert up.acquire()
    keys = up.keys
    assert lock_client.redis.zscore(keys.indexes[4], up.owner or "") is None  # u:hi
    assert not lock.write(1e300, math.inf).acquire()
    assert not lock.upgradable(-math.inf, 5).acquire()
    low = lock.upgradable(-math.inf, 4.99, heartbeat=False)
    assert low.acquire()
    low.release()
    nested = up.write(1e300, math.inf, heartbeat=False)
    assert nested.acquire()
    assert not lock.read(1e301, math.inf).acquire()
    beside = lock.read(10, 11)
    assert beside.acquire()
    beside.release()
    nested.release()
    up.shrink(5, 6)
    assert lock_client.redis.zscore(keys.indexes[4], up.owner or "") == 6.0
    assert lock_client.redis.pttl(keys.indexes[4]) > 0
    assert lock.write(6.01, math.inf).acquire()
    assert not lock.write(6, 7).acquire()
    up.release()


def test_a_release_takes_its_hold_out_of_every_index_and_asks_no_more() -> None:
    """Finite, up to +inf, and shrunk from +inf to a finite hi: each release removes the
    hold's entries from every index it was in. A hold up to +inf has no hi entry, so its
    release removes two entries (expiry, lo) with two ZREMs, a finite one three."""
    with RedisServer() as server:  # its own: the ZREM count is the server's
        client = LockClient.from_url(server.url)
        try:
            lock = client.range_lock("tidy")
            finite = lock.read(1, 2, heartbeat=False)
            open_ended = lock.read(3, math.inf, heartbeat=False)
            shrunk = lock.upgradable(5, math.inf, heartbeat=False)
            for hold in (finite, open_ended, shrunk):
                assert hold.acquire()
            shrunk.shrink(5, 6)
            indexes = finite.keys.indexes
            assert client.redis.zscore(indexes[4], shrunk.owner or "") == 6.0  # u:hi

            def zrems() -> int:
                stats = client.redis.info("commandstats").get("cmdstat_zrem", {})
                return int(stats.get("calls", 0))

            for hold, removals in ((finite, 3), (open_ended, 2), (shrunk, 3)):
                owner = hold.owner or ""
                before = zrems()
                hold.release()
                assert zrems() - before == removals
                assert [client.redis.zscore(key, owner) for key in indexes] == [None] * 7
            everything = lock.write(-math.inf, math.inf, heartbeat=False)
            assert everything.acquire()
            everything.release()
        finally:
            client.close()


def test_upgradable_nests_a_write_that_waits_only_for_other_readers(
    lock_client: LockClient,
) -> None:
    lock = lock_client.range_lock("nest")
    up = lock.upgradable(0, 100)
    assert up.acquire()
    other_reader = lock.read(40, 50)
    assert other_reader.acquire()
    with pytest.raises(ConfigurationError):
        up.write(90, 101)  # not inside the upgradable range
    with pytest.raises(LockError):
        other_reader.write(41, 42)  # only an upgradable can nest
    free_part = up.write(60, 70)
    assert free_part.acquire()  # no conflict with its own upgradable parent
    assert not lock.read(65, 66).acquire()  # but it is a writer for everybody else
    assert lock.read(1, 2).acquire()  # the upgradable itself still admits readers
    assert not lock.upgradable(99, 200).acquire()
    blocked = up.write(30, 45)
    assert not blocked.acquire()  # waits for the other owner's reader
    done = threading.Event()
    thread = threading.Thread(target=lambda: blocked.acquire(wait=10) and done.set())
    thread.start()
    deadline = time.monotonic() + 5
    while not lock_client.redis.exists(up.keys.queue[2]):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert not lock.read(31, 32).acquire()  # the waiting write holds new readers back
    assert lock.read(80, 81).acquire()  # ... only where it will write
    other_reader.release()
    assert done.wait(5)
    thread.join()
    assert blocked.held and blocked.token is not None and blocked.token > free_part.token
    blocked.release()
    free_part.release()
    up.release()
    assert lock.write(0, 100).acquire() is False  # the two reads taken above remain
    assert lock.write(3, 30).acquire()


def test_nested_write_needs_a_held_parent(lock_client: LockClient) -> None:
    lock = lock_client.range_lock("orphan")
    up = lock.upgradable(0, 10, heartbeat=False)
    nested = up.write(1, 2)
    with pytest.raises(LockError):
        nested.acquire()  # the parent was never acquired
    assert up.acquire()
    assert nested.acquire()


def test_waiting_writer_is_not_starved_by_overlapping_readers(lock_client: LockClient) -> None:
    lock = lock_client.range_lock("stream")
    stop = threading.Event()

    def reader_loop(lo: float) -> None:
        while not stop.is_set():
            with lock.read(lo, lo + 5, wait=30):
                stop.wait(0.02)

    threads = [threading.Thread(target=reader_loop, args=(lo,)) for lo in (0, 2, 4)]
    for thread in threads:
        thread.start()
    try:
        started = time.monotonic()
        writer = lock.write(3, 4)
        assert writer.acquire(wait=10)
        assert time.monotonic() - started < 3.0
        writer.release()
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)


@pytest.mark.timeout(60)
def test_sigkilled_range_holder_is_freed_within_its_ttl(
    lock_client: LockClient, lock_redis_url: str
) -> None:
    holder = killable_holder(lock_redis_url, lock_client.prefix, "range", "crash", 1.0)
    with holder as (pid, owner):
        [info] = rangelock.list_holders(lock_client)
        assert (info["owner"], info["lo"], info["hi"], info["mode"]) == (owner, 0, 10, "read")
        assert info["kind"] == "range"
        writer = lock_client.range_lock("crash").write(5, 15)
        assert not writer.acquire(wait=1.5)  # alive: renewed by its heartbeat
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        assert writer.acquire(wait=10)
        assert time.monotonic() - killed < 2.0
        writer.release()


def test_dead_holder_frees_its_range_when_the_expiry_index_ran_out_before_its_own_index(
    lock_client: LockClient,
) -> None:
    # A release leaves index expiries alone, so the write index keeps the 300 s expiry the
    # released writer gave it, while the read acquire sets the expiry index to the lock's
    # latest expiry, the dead writer's 1 s. Once that index ran out, nothing pruned the dead
    # writer's entry from the write index, and [2, 3] stayed locked for 300 s.
    lock = lock_client.range_lock("outlived")
    released = lock.write(0, 1, ttl=300, heartbeat=False)
    assert released.acquire()
    dead = lock.write(2, 3, ttl=1, heartbeat=False)  # never renewed: as if its process died
    assert dead.acquire()
    released.release()
    brief = lock.read(5, 6, ttl=0.5, heartbeat=False)
    assert brief.acquire()
    keys = dead.keys
    wait_for(
        lambda: not lock_client.redis.exists(keys.indexes[0]), 5, "the expiry index to run out"
    )
    assert lock_client.redis.zscore(keys.indexes[5], dead.owner or "") is not None
    assert lock.write(2, 3, heartbeat=False).acquire(wait=0)
    assert lock_client.redis.zscore(keys.indexes[5], dead.owner or "") is None


def test_clear_holder_and_every_key_expires(lock_client: LockClient) -> None:
    lock = lock_client.range_lock("admin")
    held = lock.write(1, 2, heartbeat=False)
    assert held.acquire()
    assert lock.read(3, 4).acquire()
    assert try_acquire(lock.write(0, 5), "waiter", True)[0] is False
    # The locks' keys (in hash tags): the prefix's key layout record is meant to stay.
    keys = lock_client.redis.keys(lock_client.prefix + "{*")
    assert len(keys) >= 8
    assert all(lock_client.redis.pttl(key) > 0 for key in keys)
    assert rangelock.clear_holder(lock_client, "admin", held.owner or "", held.token)
    assert lock.write(1, 2).acquire()


@pytest.mark.parametrize(
    ("lo", "hi", "argument"),
    [
        (2, 1, "lo"),
        (math.nan, 1, "lo"),
        (0, math.nan, "hi"),
        ("0", 1, "lo"),
        (0, None, "hi"),
        (True, 2, "lo"),
    ],
)
def test_bad_intervals(lo: Any, hi: Any, argument: str) -> None:
    client = LockClient.from_url("redis://127.0.0.1:1/0")  # nothing listens there
    lock = client.range_lock("x")
    for make_handle in (lock.read, lock.upgradable, lock.write):
        with pytest.raises(ConfigurationError) as info:
            make_handle(lo, hi)
        assert info.value.argument == argument
    with pytest.raises(ConfigurationError) as info:
        lock.read(0, 1, ttl=0)
    assert info.value.argument == "ttl"


def test_range_bounds_are_doubles_so_integers_beyond_2_to_53_are_rounded(
    lock_client: LockClient,
) -> None:
    """Documented in docs/locks.md: bounds are Redis sorted-set scores (doubles). 2**53 + 1
    is not a double; it rounds to 2**53, so these two one-point ranges are the same point."""
    ranges = lock_client.range_lock("big")
    first = ranges.write(2**53, 2**53, ttl=60.0)
    second = ranges.write(2**53 + 1, 2**53 + 1, ttl=60.0)
    assert second.lo == second.hi == float(2**53)
    assert first.acquire(0)
    assert not second.acquire(0)  # overlaps: the same double
    beside = ranges.write(2**53 + 2, 2**53 + 2, ttl=60.0)
    assert beside.acquire(0)  # 2**53 + 2 is a double: disjoint
    (listed,) = [info for info in lock_client.locks("big") if info.token == first.token]
    assert listed.lo == listed.hi == 2**53
    with pytest.raises(ConfigurationError) as error:
        ranges.write(0, 10**400)  # beyond any double: refused, not rounded to inf
    assert error.value.argument == "hi"
    first.release()
    beside.release()
