"""Reader-writer locks: sharing, exclusion, writer preference, upgrade, crashes, admin."""

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

from celery_singleton_lock import (
    ConfigurationError,
    LockClient,
    LockError,
    LockExpired,
    LockTimeout,
)
from celery_singleton_lock.kinds import rwlock
from celery_singleton_lock.kinds.intervals import RESERVATION_MS


def numsub(client: LockClient, channel: bytes) -> int:
    return int(dict(client.redis.pubsub_numsub(channel))[channel])


def test_readers_share_and_one_upgradable_joins_them(lock_client: LockClient) -> None:
    rw = lock_client.rwlock("doc")
    readers = [rw.read() for _ in range(20)]
    assert all(r.acquire() for r in readers)
    up = rw.upgradable()
    assert up.acquire()
    assert not rw.upgradable().acquire()
    assert not rw.write().acquire()
    late = rw.read()
    assert late.acquire()  # readers still come in next to the upgradable
    readers.append(late)
    tokens = [r.token for r in readers[:-1]] + [up.token, late.token]
    assert tokens == sorted(set(tokens))
    for r in readers:
        r.release()
    up.release()
    assert rw.write().acquire()


def test_writer_excludes_everyone(lock_client: LockClient) -> None:
    rw = lock_client.rwlock("doc")
    writer = rw.write()
    with writer:
        assert writer.held
        assert not rw.read().acquire()
        assert not rw.upgradable().acquire()
        assert not rw.write().acquire()
        with pytest.raises(LockTimeout), rw.read(wait=0.05):
            pass
    assert writer.acquire()
    writer.release()
    reader = rw.read()
    assert reader.acquire()
    assert not rw.write().acquire()
    reader.release()


def test_tokens_increase_across_modes_and_the_lease(lock_client: LockClient) -> None:
    rw = lock_client.rwlock("fenced")
    tokens = []
    for handle in (rw.read(), rw.upgradable(), rw.write(), lock_client.lease("fenced"), rw.read()):
        with handle:
            tokens.append(handle.token)
    assert tokens == sorted(set(tokens)), tokens


@pytest.mark.timeout(60)
def test_writer_not_starved_by_continuous_readers(lock_client: LockClient) -> None:
    rw = lock_client.rwlock("busy")
    stop = threading.Event()
    overlapped = threading.Event()
    inside = [0]
    count_lock = threading.Lock()
    errors: list[BaseException] = []

    def reader_loop() -> None:
        try:
            while not stop.is_set():
                with rw.read(wait=30):
                    with count_lock:
                        inside[0] += 1
                        if inside[0] >= 2:
                            overlapped.set()
                    stop.wait(0.02)  # hold a little so the readers always overlap
                    with count_lock:
                        inside[0] -= 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader_loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        assert overlapped.wait(10)  # the lock is never free of readers from here on
        started = time.monotonic()
        writer = rw.write()
        assert writer.acquire(wait=10)
        waited = time.monotonic() - started
        with count_lock:
            assert inside[0] == 0
        writer.release()
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not errors
    assert waited < 3.0  # bounded by one reader hold plus a round trip, not by the stream


@pytest.mark.timeout(60)
def test_readers_behind_a_writer_all_get_in_together(lock_redis_url: str, lock_prefix: str) -> None:
    clients = [LockClient.from_url(lock_redis_url, prefix=lock_prefix) for _ in range(6)]
    try:
        main, readers = clients[0], clients[1:]
        writer = main.rwlock("shared").write()
        assert writer.acquire()
        together = threading.Barrier(len(readers) + 1)
        got: list[float] = []

        def read(client: LockClient) -> None:
            handle = client.rwlock("shared").read(wait=20)
            assert handle.acquire()
            got.append(time.monotonic())
            together.wait(10)  # every reader holds its share at the same moment
            handle.release()

        threads = [threading.Thread(target=read, args=(c,)) for c in readers]
        for thread in threads:
            thread.start()
        channel = writer.keys.channel
        deadline = time.monotonic() + 10
        while numsub(main, channel) < len(readers):  # all of them are waiting now
            assert time.monotonic() < deadline
            time.sleep(0.01)
        released = time.monotonic()
        writer.release()
        together.wait(10)
        for thread in threads:
            thread.join(10)
        assert len(got) == len(readers)
        assert max(got) - released < 1.0  # woken by the release, not by the 30 s lease
    finally:
        for client in clients:
            client.close()


def test_waiting_writer_blocks_new_readers_until_it_gives_up(lock_client: LockClient) -> None:
    rw = lock_client.rwlock("pref")
    reader = rw.read()
    assert reader.acquire()
    writer = rw.write()
    waiting = threading.Thread(target=lambda: writer.acquire(wait=1.0))
    waiting.start()
    deadline = time.monotonic() + 5
    while not lock_client.redis.exists(rw.read().keys.queue):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert not rw.read().acquire()  # writer preference
    assert not rw.upgradable().acquire()
    late = rw.read()
    assert late.acquire(wait=5)  # gets in once the writer stops waiting
    waiting.join()
    assert not writer.held
    late.release()
    reader.release()


def test_dead_waiting_writer_stops_blocking_readers_quickly(lock_client: LockClient) -> None:
    rw = lock_client.rwlock("ghost")
    reader = rw.read()
    assert reader.acquire()
    ghost = rw.write()
    assert try_acquire(ghost, "ghost-owner", True) == (False, RESERVATION_MS // 3)
    assert not rw.read().acquire()
    started = time.monotonic()
    late = rw.read()
    assert late.acquire(wait=5)
    assert time.monotonic() - started < RESERVATION_MS / 1000 + 1.0
    late.release()
    reader.release()


def test_upgrade_waits_for_readers_and_holds_new_ones_back(lock_client: LockClient) -> None:
    rw = lock_client.rwlock("up")
    reader, up = rw.read(), rw.upgradable()
    assert reader.acquire() and up.acquire()
    assert not up.upgrade(wait=0)
    done = threading.Event()
    thread = threading.Thread(target=lambda: up.upgrade(wait=10) and done.set())
    thread.start()
    deadline = time.monotonic() + 5
    while not lock_client.redis.exists(up.keys.queue):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert not rw.read().acquire()  # a waiting upgrade holds new readers back
    assert not done.is_set()
    reader.release()
    assert done.wait(5)
    thread.join()
    assert up.upgraded and up.held
    assert not rw.read().acquire()
    up.downgrade()
    assert not up.upgraded
    again = rw.read()
    assert again.acquire()
    assert not rw.write().acquire()
    again.release()
    up.release()
    assert rw.write().acquire()


def test_upgrade_only_for_upgradable_and_downgrade_only_when_upgraded(
    lock_client: LockClient,
) -> None:
    rw = lock_client.rwlock("modes")
    reader = rw.read()
    assert reader.acquire()
    with pytest.raises(LockError):
        reader.upgrade()
    up = rw.upgradable()
    with pytest.raises(LockError):
        up.downgrade()
    reader.release()


def test_given_up_upgrade_lets_readers_in(lock_client: LockClient) -> None:
    rw = lock_client.rwlock("giveup")
    reader, up = rw.read(), rw.upgradable()
    assert reader.acquire() and up.acquire()
    assert not up.upgrade(wait=0.2)
    assert not lock_client.redis.exists(up.keys.queue)
    assert rw.read().acquire()
    assert up.held and not up.upgraded


@pytest.mark.timeout(60)
def test_sigkilled_reader_frees_its_share_within_its_ttl(
    lock_client: LockClient, lock_redis_url: str
) -> None:
    holder = killable_holder(lock_redis_url, lock_client.prefix, "rw", "crash", 1.0)
    with holder as (pid, owner):
        assert [h["owner"] for h in rwlock.list_holders(lock_client)] == [owner]
        writer = lock_client.rwlock("crash").write()
        assert not writer.acquire(wait=1.5)  # alive: the heartbeat keeps its share
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        assert writer.acquire(wait=10)
        assert time.monotonic() - killed < 2.0  # within one 1 s lease (+ margin)
        writer.release()


def test_heartbeat_keeps_short_holds_alive(lock_client: LockClient) -> None:
    rw = lock_client.rwlock("hb")
    reader = rw.read(ttl=0.3)
    assert reader.acquire()
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline:
        reader.check()
        time.sleep(0.05)
    assert not rw.write().acquire()
    reader.release()


def test_hold_without_heartbeat_runs_out(lock_client: LockClient) -> None:
    rw = lock_client.rwlock("nohb")
    reader = rw.read(ttl=0.1, heartbeat=False)
    assert reader.acquire()
    assert rw.write().acquire(wait=2)
    assert reader.lost
    with pytest.raises(LockExpired):
        reader.release()


def test_extend_sets_the_remaining_time(lock_client: LockClient) -> None:
    reader = lock_client.rwlock("ext").read(ttl=10, heartbeat=False)
    assert reader.acquire()
    for _ in range(3):
        assert reader.extend(2) == pytest.approx(2.0)
    assert lock_client.redis.pttl(reader.keys.holder(reader.owner or "")) <= 2000
    reader.release()


def test_list_and_clear_holders(lock_client: LockClient) -> None:
    rw = lock_client.rwlock("admin")
    reader = rw.read(owner_info={"task_name": "report", "task_id": "t-1"})
    up = rw.upgradable()
    assert reader.acquire() and up.acquire()
    holders = {h["owner"]: h for h in rwlock.list_holders(lock_client, "adm*")}
    assert set(holders) == {reader.owner, up.owner}
    info = holders[reader.owner]
    assert info["kind"] == "read" and info["name"] == "admin" and info["task_id"] == "t-1"
    assert info["token"] == reader.token and info["pid"] == os.getpid()
    assert 0 < info["pttl_ms"] <= 30_000 and info["ttl_ms"] == 30_000
    assert rwlock.list_holders(lock_client, "other*") == []
    assert not rwlock.clear_holder(lock_client, "admin", reader.owner or "", token=1)
    assert rwlock.clear_holder(lock_client, "admin", reader.owner or "", token=reader.token)
    # Cleared again, as a clear sent again after its reply was lost: answered cleared.
    assert rwlock.clear_holder(lock_client, "admin", reader.owner or "")
    with pytest.raises(LockExpired):
        reader.release()
    up.release()
    assert rw.write().acquire()


def test_every_key_expires(lock_client: LockClient) -> None:
    rw = lock_client.rwlock("exp")
    reader, up = rw.read(), rw.upgradable()
    assert reader.acquire() and up.acquire()
    writer = rw.write()
    assert try_acquire(writer, "waiting", True)[0] is False
    # The locks' keys (in hash tags): the prefix's key layout record is meant to stay.
    keys = lock_client.redis.keys(lock_client.prefix + "{*")
    assert len(keys) > 5
    assert all(lock_client.redis.pttl(key) > 0 for key in keys)


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"ttl": 0}, "ttl"),
        ({"ttl": math.nan}, "ttl"),
        ({"wait": -1}, "wait"),
        ({"max_hold": 1, "ttl": 5}, "max_hold"),
        ({"heartbeat": 1}, "heartbeat"),
        ({"on_lost": 3}, "on_lost"),
        ({"owner_info": [1]}, "owner_info"),
    ],
)
def test_bad_arguments_raise_before_redis(options: dict[str, Any], argument: str) -> None:
    client = LockClient.from_url("redis://127.0.0.1:1/0")  # nothing listens there
    for make in (client.rwlock("x").read, client.rwlock("x").upgradable, client.rwlock("x").write):
        with pytest.raises(ConfigurationError) as info:
            make(**options)
        assert info.value.argument == argument
    with pytest.raises(ConfigurationError) as info:
        client.rwlock("")
    assert info.value.argument == "name"


@pytest.mark.parametrize("dead", [3, 300])  # a small hash, and one HSCAN pages through
def test_writer_drops_dead_readers_and_waits_for_a_live_one(
    lock_client: LockClient, dead: int
) -> None:
    rw = lock_client.rwlock("dead-readers")
    readers = [rw.read(heartbeat=False) for _ in range(dead + 1)]
    assert all(reader.acquire(0) for reader in readers)
    live, *crashed = readers
    # As if their holders died and their leases ran out: their hashes are gone, their
    # fields in the lock hash stay until someone meets them.
    lock_client.redis.delete(*(reader.keys.holder(reader.owner or "") for reader in crashed))
    writer = rw.write(heartbeat=False)
    taken, hint = try_acquire(writer, "writer", False)
    assert not taken and 0 < hint <= 30_000  # the live reader is in its way
    live.release()
    assert writer.acquire(0)
    assert lock_client.redis.hkeys(writer.keys.lock) == [b"w"]  # the dead readers dropped
    writer.release()
    assert not lock_client.redis.exists(writer.keys.lock)
