"""Reader-writer, range and multi-key locks and the admin view, the same for the sync and the
asyncio client (``side``); and async holders against sync ones and SingletonTask runs."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest
from celery import Celery
from support.async_sides import Side, eventually, run, run_with, side_fixture  # noqa: F401

from celery_singleton_lock import (
    AsyncLockClient,
    LockClient,
    LockError,
    LockExpired,
    LockInfo,
    SingletonTask,
    is_skipped,
)
from celery_singleton_lock.aio.heartbeat import heartbeat


def stable(info: LockInfo) -> LockInfo:
    """``info`` without the times, which differ between two listings."""
    return dataclasses.replace(
        info,
        age_s=None,
        lease_remaining_s=None,
        max_hold_remaining_s=None,
        heartbeat_age_s=None,
    )


async def subscribers(client: LockClient, channel: bytes) -> int:
    replies = await asyncio.to_thread(client.redis.pubsub_numsub, channel)
    return int(dict(replies).get(channel, 0))


def test_readers_share_and_a_waiting_writer_holds_new_readers_back(
    side: Side, lock_client: LockClient
) -> None:
    async def body(s: Side) -> None:
        lock = s.rwlock("data")
        readers = [lock.read(), lock.read()]
        for reader in readers:
            assert await reader.acquire()
        assert not await lock.write().acquire()
        writer = lock.write()
        waiting = asyncio.ensure_future(writer.acquire(wait=20))
        channel = writer.keys.channel
        await eventually(lambda: subscribers(lock_client, channel), 10, "the writer to wait")
        late = lock.read()
        assert not await late.acquire()  # writer preference: the reservation holds it back
        for reader in readers:
            await reader.release()
        assert await waiting  # woken by the last reader's release
        assert not await late.acquire()
        await writer.release()
        assert await late.acquire()
        await late.release()

    run_with(side, body)


def test_an_upgradable_hold_upgrades_and_downgrades(side: Side) -> None:
    async def body(s: Side) -> None:
        lock = s.rwlock("doc")
        hold = lock.upgradable()
        assert await hold.acquire()
        reader = lock.read()
        assert await reader.acquire()  # readers share with the upgradable
        assert not await lock.upgradable().acquire()  # but one upgradable at a time
        assert not await hold.upgrade(wait=0)  # the reader is still in
        await reader.release()
        assert await hold.upgrade(wait=2)
        assert not await lock.read().acquire()
        await hold.downgrade()
        other = lock.read()
        assert await other.acquire()
        await other.release()
        await hold.release()

    run_with(side, body)


def test_ranges_conflict_only_where_they_overlap_and_shrink_frees_the_rest(side: Side) -> None:
    async def body(s: Side) -> None:
        lock = s.range_lock("rows")
        held = lock.write(0, 100)
        assert await held.acquire()
        assert await lock.write(101, 200).acquire()  # disjoint
        assert not await lock.read(100, 150).acquire()  # closed intervals touch at 100
        await held.shrink(0, 10)
        handle = getattr(held, "handle", held)  # the sync side wraps its handle
        assert repr(handle) == f"<{type(handle).__name__} 'rows' write [0.0, 10.0] held>"
        freed = lock.write(11, 100)
        assert await freed.acquire()
        assert not await lock.read(5, 5).acquire()
        await freed.release()
        await held.release()
        everything = lock.write(-math.inf, math.inf, wait=2)
        assert not await everything.acquire(wait=0)  # [101, 200] is still held

    run_with(side, body)


def test_a_write_nested_in_an_upgradable_range(side: Side) -> None:
    async def body(s: Side) -> None:
        lock = s.range_lock("nest")
        outer = lock.upgradable(0, 10)
        assert await outer.acquire()
        inner = outer.write(2, 3)
        assert await inner.acquire()
        assert not await lock.read(2, 2).acquire()
        assert await lock.read(5, 6).acquire()  # readers still share the rest
        await inner.release()
        await outer.release()

    run_with(side, body)


def test_multi_is_all_or_nothing_and_excludes_plain_leases(
    side: Side, lock_client: LockClient
) -> None:
    async def body(s: Side) -> None:
        blocker = s.lease("b")
        assert await blocker.acquire()
        both = s.multi(["a", "b"])
        assert not await both.acquire()
        free = s.lease("a")
        assert await free.acquire(), "a must not be held by the failed multi"
        await free.release()
        names = s.multi(["c", "d"])
        assert await names.acquire()
        assert set(names.tokens) == {"c", "d"}
        assert names.token == max(names.tokens.values())
        assert not await s.lease("d").acquire()
        waiter = s.lease("c")
        waiting = asyncio.ensure_future(waiter.acquire(wait=20))
        channel = waiter.keys.channel
        await eventually(lambda: subscribers(lock_client, channel), 10, "the waiter to wait")
        await names.release()
        assert await waiting
        await waiter.release()
        await blocker.release()

    run_with(side, body)


def test_async_holds_exclude_sync_ones_of_every_kind(lock_redis_url: str, lock_prefix: str) -> None:
    async def body() -> None:
        sync = LockClient.from_url(lock_redis_url, prefix=lock_prefix)
        aio = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        try:
            write = aio.rwlock("rw").write()
            assert await write.acquire()
            assert not sync.rwlock("rw").read().acquire()
            ranged = aio.range_lock("range").read(0, 10)
            assert await ranged.acquire()
            assert not sync.range_lock("range").write(10, 20).acquire()
            assert sync.range_lock("range").read(5, 20).acquire()
            multi = aio.multi(["m1", "m2"])
            assert await multi.acquire()
            assert not sync.lease("m2").acquire()
            assert not sync.multi(["m0", "m1"]).acquire()
            sync_write = sync.rwlock("rw2").write()
            assert sync_write.acquire()
            assert not await aio.rwlock("rw2").read().acquire()
            sync_write.release()
            for handle in (write, ranged, multi):
                await handle.release()
            assert sync.rwlock("rw").write().acquire()
        finally:
            sync.close()
            await aio.close()

    run(body())


def test_locks_lists_what_the_sync_admin_lists_and_clear_is_holder_checked(
    side: Side, lock_redis_url: str, lock_prefix: str, lock_client: LockClient
) -> None:
    async def body(s: Side) -> None:
        aio = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        lost = asyncio.Event()
        holds = [
            s.lease("lease", owner_info={"task_name": "app.report", "user": "ann"}),
            s.rwlock("rw").read(),
            s.range_lock("range").write(1, 2),
            s.multi(["m1", "m2"]),
        ]
        try:
            for hold in holds:
                assert await hold.acquire()
            delayed = s.lease("delayed")
            assert await delayed.acquire()
            await delayed.release(delay=30)
            infos = await aio.locks()
            assert [stable(i) for i in infos] == [stable(i) for i in lock_client.locks()]
            assert [(i.name, i.kind, i.state) for i in infos] == [
                ("delayed", "lease", "release-delay"),
                ("lease", "lease", "live"),
                ("m1", "multi", "live"),
                ("m2", "multi", "live"),
                ("range", "range", "live"),
                ("rw", "read", "live"),
            ]
            assert infos[1].task_name == "app.report" and infos[1].info == {"user": "ann"}
            assert [i.name for i in await aio.locks("m*")] == ["m1", "m2"]
            with pytest.raises(LockError):
                await aio.clear("lease")  # live: only with force
            assert not await aio.clear("lease", token=holds[0].token + 1, force=True)
            holds[0].on_lost = lambda _: lost.set()
            assert await aio.clear("lease", token=holds[0].token, force=True)
            for name in ("rw", "range", "m1", "delayed"):
                assert await aio.clear(name, force=True), name
            assert {i.name for i in await aio.locks()} == {"m2"}
            await s.tick()  # the holders find out at their next renewal
            await eventually(lost.is_set, 10, "on_lost of the cleared lease")
            for hold in holds:
                assert hold.lost, hold
                with pytest.raises(LockExpired):
                    hold.check()
        finally:
            await aio.close()

    run_with(side, body)


def test_an_async_hold_makes_a_singleton_task_skip(
    celery_lock_app: Celery, lock_redis_url: str, lock_prefix: str
) -> None:
    @celery_lock_app.task(base=SingletonTask, shared=False)
    def report(day: str) -> str:
        return day

    @celery_lock_app.task(base=SingletonTask, shared=False, lock_mode="read")
    def export(dataset: str) -> str:
        return dataset

    async def body() -> None:
        aio = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        try:
            async with aio.lease(report.lock_name(["2026-11-22"])):
                assert is_skipped(report.apply(args=["2026-11-22"]).get())
                assert report.apply(args=["2026-11-23"]).get() == "2026-11-23"
            assert report.apply(args=["2026-11-22"]).get() == "2026-11-22"
            async with aio.rwlock(export.lock_name(["d1"])).write():
                assert is_skipped(export.apply(args=["d1"]).get())
            async with aio.rwlock(export.lock_name(["d1"])).read():
                assert export.apply(args=["d1"]).get() == "d1"  # readers share
            assert heartbeat().leases() == []
        finally:
            await aio.close()

    run(body())


def test_a_cancelled_waiting_writer_withdraws_its_reservation(
    lock_redis_url: str, lock_prefix: str, lock_client: LockClient
) -> None:
    """Async only: a thread blocked in a sync acquire cannot be cancelled."""

    async def body() -> None:
        aio = AsyncLockClient.from_url(lock_redis_url, prefix=lock_prefix)
        lock = aio.rwlock("queue")
        reader = lock.read()
        assert await reader.acquire()
        writer = lock.write()
        waiting = asyncio.ensure_future(writer.acquire(wait=30))
        channel = writer.keys.channel
        await eventually(lambda: subscribers(lock_client, channel), 10, "the writer to wait")
        assert not await lock.read().acquire()  # held back by the writer's reservation
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert waiting.cancelled()
        late = lock.read()
        assert await late.acquire()  # at once: not after the reservation ran out
        assert await subscribers(lock_client, channel) == 0
        await late.release()
        await reader.release()
        await aio.close()

    run(body())
