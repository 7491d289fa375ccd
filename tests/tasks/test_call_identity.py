"""The ``call`` option of the shared holds (read, upgradable, write and range holds, semaphore
permits): an acquire is refused, in its own script call, while a hold of the same call
identity stands on the lock (``held_by_call``), even where the two holds would share; other
call identities and holds with none are let in as before. The same with the sync and the
asyncio client (``side``)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.async_sides import Side, eventually, run_with, side_fixture  # noqa: F401

from celery_singleton_lock import ConfigurationError, LockClient
from celery_singleton_lock.kinds import rangelock, rwlock, semaphore

#: Makes a not yet acquired shared hold on one name, with these handle options, on a side.
Make = Callable[[Side, dict[str, Any]], Any]

#: Every kind whose holds share: two holds of it, of different calls, are both let in.
SHARED: dict[str, Make] = {
    "read": lambda s, options: s.rwlock("doc").read(**options),
    "range read": lambda s, options: s.range_lock("doc").read(0, 10, **options),
    "permit": lambda s, options: s.semaphore("doc", 3).permit(**options),
}


@pytest.mark.parametrize("kind", list(SHARED))
def test_a_hold_of_the_same_call_is_refused_and_of_another_call_let_in(
    side: Side, kind: str
) -> None:
    make = SHARED[kind]

    async def body(s: Side) -> None:
        original = make(s, {"call": "call-1"})
        assert await original.acquire()
        copy = make(s, {"call": "call-1"})
        assert not await copy.acquire()
        assert copy.held_by_call and not copy.held
        # Never waited for: another caller's release would not let the copy in either.
        started = time.monotonic()
        assert not await copy.acquire(wait=20)
        assert copy.held_by_call and time.monotonic() - started < 10
        other = make(s, {"call": "call-2"})
        assert await other.acquire()
        assert not other.held_by_call
        anonymous = make(s, {})
        assert await anonymous.acquire()
        assert not anonymous.held_by_call
        await original.release()
        assert await copy.acquire()  # the call's hold is gone: the copy may hold now
        assert not copy.held_by_call
        for hold in (copy, other, anonymous):
            await hold.release()

    run_with(side, body)


@pytest.mark.parametrize(
    ("held", "asked"),
    [
        ("upgradable", "read"),  # the lock names the upgradable's owner: its hash says
        ("write", "read"),
        ("read", "write"),  # refused for the call, not merely blocked
        ("read", "upgradable"),
    ],
)
def test_every_mode_of_a_reader_writer_lock_finds_the_calls_hold(
    side: Side, held: str, asked: str
) -> None:
    async def body(s: Side) -> None:
        lock = s.rwlock("doc")
        original = getattr(lock, held)(call="call-1")
        assert await original.acquire()
        copy = getattr(lock, asked)(call="call-1")
        assert not await copy.acquire()
        assert copy.held_by_call
        await original.release()
        assert await copy.acquire()
        await copy.release()

    run_with(side, body)


def test_a_range_hold_of_the_call_elsewhere_on_the_name_is_found(side: Side) -> None:
    async def body(s: Side) -> None:
        lock = s.range_lock("ledger")
        original = lock.read(0, 10, call="call-1")
        assert await original.acquire()
        elsewhere = lock.write(100, math.inf, call="call-1")  # overlaps nothing
        assert not await elsewhere.acquire()
        assert elsewhere.held_by_call
        stranger = lock.write(100, math.inf, call="call-2")
        assert await stranger.acquire()
        await stranger.release()
        await original.release()

    run_with(side, body)


def test_a_full_semaphore_refuses_a_copy_for_its_call_not_for_the_limit(side: Side) -> None:
    async def body(s: Side) -> None:
        sem = s.semaphore("pool", 1)
        original = sem.permit(call="call-1")
        assert await original.acquire()
        copy = sem.permit(call="call-1")
        assert not await copy.acquire()
        assert copy.held_by_call
        stranger = sem.permit(call="call-2")
        assert not await stranger.acquire()
        assert not stranger.held_by_call  # at the limit, as before
        await original.release()

    run_with(side, body)


@pytest.mark.parametrize("kind", list(SHARED))
def test_a_dead_hold_of_the_call_refuses_nothing(
    side: Side, kind: str, lock_client: LockClient
) -> None:
    make = SHARED[kind]

    async def body(s: Side) -> None:
        dead = make(s, {"call": "call-1", "ttl": 0.2, "heartbeat": False})
        assert await dead.acquire()
        hold_key = dead.keys.holder(dead.owner)
        await eventually(lambda: not lock_client.redis.exists(hold_key), 10, "the hold to expire")
        copy = make(s, {"call": "call-1"})
        assert await copy.acquire()
        assert not copy.held_by_call
        await copy.release()

    run_with(side, body)


def test_holders_of_a_refused_hold_name_the_calls_hold(lock_client: LockClient) -> None:
    for make in (
        lambda options: lock_client.rwlock("doc").read(**options),
        lambda options: lock_client.range_lock("doc").read(0, 10, **options),
        lambda options: lock_client.semaphore("doc", 3).permit(**options),
    ):
        original = make({"call": "call-1", "owner_info": {"task_id": "t-1"}})
        other = make({"call": "call-2", "owner_info": {"task_id": "t-2"}})
        assert original.acquire() and other.acquire()
        copy = make({"call": "call-1"})
        assert not copy.acquire()
        # Read holds share, so a refused reader lists no other reader as in its way; the
        # hold of its own call is.
        task_ids = {holder.task_id for holder in copy.holders()}
        assert "t-1" in task_ids
        assert ("t-2" in task_ids) == (copy.kind == "semaphore")  # at a limit: every permit
        original.release()
        other.release()


def test_the_call_is_stored_in_the_holds_hash_and_listed(lock_client: LockClient) -> None:
    for hold, listed in (
        (lock_client.rwlock("doc").read(call="call-1"), rwlock.list_holders),
        (lock_client.range_lock("doc").read(0, 10, call="call-1"), rangelock.list_holders),
        (lock_client.semaphore("doc", 3).permit(call="call-1"), semaphore.list_holders),
    ):
        with hold:
            assert hold.call == "call-1"
            assert lock_client.redis.hget(hold.keys.holder(hold.owner), "call") == b"call-1"
            assert [holder.get("call") for holder in listed(lock_client)] == ["call-1"]
    plain = lock_client.rwlock("doc").read()
    with plain:
        assert plain.call is None
        assert lock_client.redis.hget(plain.keys.holder(plain.owner), "call") is None


@pytest.mark.parametrize("call", ["", 7, b"call-1"])
def test_a_bad_call_identity_is_refused_before_any_redis_call(
    lock_client: LockClient, call: Any
) -> None:
    for make in (
        lambda: lock_client.rwlock("doc").read(call=call),
        lambda: lock_client.range_lock("doc").read(0, 10, call=call),
        lambda: lock_client.semaphore("doc", 3).permit(call=call),
    ):
        with pytest.raises(ConfigurationError, match="call"):
            make()


@pytest.mark.parametrize("kind", list(SHARED))
def test_a_hold_of_the_call_in_its_release_delay_refuses_nothing(side: Side, kind: str) -> None:
    make = SHARED[kind]

    async def body(s: Side) -> None:
        ended = make(s, {"call": "call-1"})
        assert await ended.acquire()
        await ended.release(delay=60)  # the call ended; its hold stays for everyone else
        again = make(s, {"call": "call-1"})
        assert await again.acquire()
        assert not again.held_by_call
        await again.release()

    run_with(side, body)


#: The shared holds of a sync client, with the call identity "call-1" and no heartbeat.
CALLED: dict[str, Callable[[LockClient], Any]] = {
    "read": lambda c: c.rwlock("trips").read(heartbeat=False, call="call-1"),
    "range read": lambda c: c.range_lock("trips").read(0, 10, heartbeat=False, call="call-1"),
    "permit": lambda c: c.semaphore("trips", 2).permit(heartbeat=False, call="call-1"),
}


@pytest.mark.parametrize("refused", [False, True])
@pytest.mark.parametrize("kind", list(CALLED))
def test_one_round_trip_per_acquire_with_a_call(
    lock_client: LockClient, monkeypatch: pytest.MonkeyPatch, kind: str, refused: bool
) -> None:
    warm = CALLED[kind](lock_client)
    assert warm.acquire()  # loads the scripts; refused: the call's hold stays
    if not refused:
        warm.release()
    sent: list[Any] = []
    execute = lock_client.redis.execute_command

    def counted(*args: Any, **kwargs: Any) -> Any:
        sent.append(args[0])
        return execute(*args, **kwargs)

    monkeypatch.setattr(lock_client.redis, "execute_command", counted)
    hold = CALLED[kind](lock_client)
    assert hold.acquire() is not refused
    assert hold.held_by_call is refused
    assert sent == ["EVALSHA"]
    monkeypatch.undo()
    (warm if refused else hold).release()
