"""Counting semaphores: the limit under threads and processes, fencing, wake-ups, crashes,
the admin view, and arguments checked before any Redis call. (A holder SIGKILLed or paused
past its ttl and Redis restarted are in test_locks_faults.py, with the other kinds.)"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import pytest
from support.attempts import try_acquire
from support.kind_children import holder_process
from support.semaphore_children import permit_worker
from support.waiting import BackgroundAcquire, wait_for, wait_for_subscriber

from celery_singleton_lock import (
    ConfigurationError,
    LockClient,
    LockError,
    LockExpired,
    Permit,
    Semaphore,
)
from celery_singleton_lock.kinds import semaphore


def test_at_most_limit_permits_and_tokens_increase(lock_client: LockClient) -> None:
    sem = lock_client.semaphore("exports:acme", 3)
    permits = [sem.permit() for _ in range(3)]
    assert all(p.acquire() for p in permits)
    tokens = [p.token for p in permits]
    assert all(isinstance(t, int) for t in tokens)
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    fourth = sem.permit()
    assert not fourth.acquire()
    assert not fourth.held
    permits[1].release()
    assert fourth.acquire()
    assert fourth.token is not None and fourth.token > max(t or 0 for t in tokens)
    assert not sem.permit().acquire()
    # Another name has permits of its own.
    assert lock_client.semaphore("exports:other", 3).permit().acquire()
    assert {h.owner for h in fourth.holders()} == {
        p.owner for p in (permits[0], permits[2], fourth)
    }


def test_tokens_are_shared_with_the_lease_of_the_same_name(lock_client: LockClient) -> None:
    permit = lock_client.semaphore("fenced", 2).permit()
    lease = lock_client.lease("fenced")  # another namespace, but the same fencing counter
    assert permit.acquire() and lease.acquire()
    second = lock_client.semaphore("fenced", 2).permit()
    assert second.acquire()
    assert (permit.token or 0) < (lease.token or 0) < (second.token or 0)


def test_the_acquiring_calls_limit_is_what_it_checks(lock_client: LockClient) -> None:
    wide = [lock_client.semaphore("mixed", 3).permit() for _ in range(3)]
    assert all(p.acquire() for p in wide)
    assert not lock_client.semaphore("mixed", 2).permit().acquire()  # 3 held >= 2
    assert lock_client.semaphore("mixed", 4).permit().acquire()  # 3 held < 4
    for p in wide:
        p.release()
    narrow = lock_client.semaphore("mixed", 2).permit()
    assert narrow.acquire()  # 1 held (the limit-4 permit) < 2


def test_a_permit_in_its_release_delay_still_counts(lock_client: LockClient) -> None:
    sem = lock_client.semaphore("cool", 1)
    permit = sem.permit()
    assert permit.acquire()
    permit.release(delay=0.5)
    released = time.monotonic()
    late = sem.permit()
    assert not late.acquire()
    assert late.acquire(wait=5)
    assert time.monotonic() - released >= 0.45


@pytest.mark.timeout(60)
def test_the_limit_holds_across_threads(lock_client: LockClient) -> None:
    limit, threads, rounds = 3, 8, 15
    sem = lock_client.semaphore("threads", limit)
    inside, most, tokens = 0, 0, []
    count = threading.Lock()
    errors: list[BaseException] = []
    go = threading.Barrier(threads)

    def work() -> None:
        nonlocal inside, most
        try:
            go.wait(10)
            for _ in range(rounds):
                with sem.permit(ttl=10, wait=30) as permit:
                    with count:
                        inside += 1
                        most = max(most, inside)
                        tokens.append(permit.token)
                    time.sleep(0.002)  # work while holding: lets the others pile up
                    with count:
                        inside -= 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(50)
    assert not errors, errors
    assert len(tokens) == threads * rounds
    assert len(set(tokens)) == len(tokens)
    assert most == limit  # reached, never passed
    assert semaphore.list_holders(lock_client, "threads") == []


@pytest.mark.timeout(90)
def test_the_limit_holds_across_processes(lock_client: LockClient, lock_redis_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    limit, processes, rounds = 2, 5, 20
    go = ctx.Event()
    workers = []
    for _ in range(processes):
        ours, theirs = ctx.Pipe()
        process = ctx.Process(
            target=permit_worker,
            args=(lock_redis_url, lock_client.prefix, "procs", limit, rounds, go, theirs),
            daemon=True,
        )
        process.start()
        workers.append((process, ours))
    try:
        go.set()
        results: list[dict[str, Any]] = []
        for _, conn in workers:
            assert conn.poll(80), "a worker did not finish"
            results.append(conn.recv())
    finally:
        for process, _ in workers:
            process.kill()
            process.join(10)
    assert max(result["most"] for result in results) == limit  # reached, never passed
    tokens = [token for result in results for token in result["tokens"]]
    assert len(set(tokens)) == len(tokens) == processes * rounds
    for result in results:  # each process saw its own tokens increase
        assert result["tokens"] == sorted(result["tokens"])


@pytest.mark.timeout(60)
def test_a_release_wakes_a_waiter_and_only_as_many_as_permits_freed(
    lock_client: LockClient,
) -> None:
    sem = lock_client.semaphore("wake", 2)
    held = [sem.permit(ttl=30), sem.permit(ttl=30)]
    assert all(p.acquire() for p in held)
    first, second = sem.permit(), sem.permit()
    waiting = [BackgroundAcquire(first, wait=20), BackgroundAcquire(second, wait=20)]
    wait_for_subscriber(lock_client, first.keys.channel)
    wait_for(lambda: lock_client.redis.exists(first.keys.waiting), 10, "a waiter's mark")
    released = time.monotonic()
    held[0].release()
    # One of the two gets the freed permit at once (not at the 30 s expiry)...
    wait_for(lambda: first.held or second.held, 5, "a waiter to get the freed permit")
    assert time.monotonic() - released < 2.0
    assert not (first.held and second.held)
    # ...and the other keeps waiting until another is freed.
    winner, loser = (first, second) if first.held else (second, first)
    assert not loser.held
    held[1].release()
    wait_for(lambda: loser.held, 5, "the second waiter")
    for background in waiting:
        assert background.done.wait(10)
        assert background.results == [True], background.errors
    assert winner.token != loser.token
    winner.release()
    loser.release()


def test_a_waiter_gives_up_after_its_wait(lock_client: LockClient) -> None:
    sem = lock_client.semaphore("full", 1)
    assert sem.permit().acquire()
    started = time.monotonic()
    assert not sem.permit().acquire(wait=0.3)
    assert 0.25 <= time.monotonic() - started < 2.0


@pytest.mark.timeout(60)
def test_a_sigkilled_holder_frees_its_permit_within_its_ttl(
    lock_client: LockClient, lock_redis_url: str
) -> None:
    ttl = 1.0
    sem = lock_client.semaphore("crash", 2)
    mine = sem.permit()
    assert mine.acquire()
    with holder_process(
        lock_redis_url, lock_client.prefix, "semaphore-pair", "crash", ttl
    ) as child:
        waiter = sem.permit()
        assert not waiter.acquire(wait=ttl + 0.5)  # alive: its heartbeat keeps the permit
        listed = {h["owner"]: h for h in semaphore.list_holders(lock_client, "crash")}
        assert set(listed) == {mine.owner, child.owner}
        os.kill(child.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert waiter.acquire(wait=ttl + 5)  # nobody released: woken by its hint
        assert time.monotonic() - killed < ttl + 0.5
        assert (waiter.token or 0) > child.token
    assert {h["owner"] for h in semaphore.list_holders(lock_client)} == {
        mine.owner,
        waiter.owner,
    }
    mine.release()
    waiter.release()
    assert semaphore.list_holders(lock_client) == []


def test_the_heartbeat_keeps_a_short_permit_and_without_it_it_runs_out(
    lock_client: LockClient,
) -> None:
    sem = lock_client.semaphore("beat", 1)
    kept = sem.permit(ttl=0.3)
    assert kept.acquire()
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline:
        kept.check()
        time.sleep(0.05)
    assert not sem.permit().acquire()
    kept.release()
    lapsing = sem.permit(ttl=0.1, heartbeat=False)
    assert lapsing.acquire()
    assert sem.permit().acquire(wait=2)
    assert lapsing.lost
    with pytest.raises(LockExpired):
        lapsing.release()


def test_extend_sets_the_remaining_time(lock_client: LockClient) -> None:
    permit = lock_client.semaphore("ext", 2).permit(ttl=10, heartbeat=False)
    assert permit.acquire()
    assert permit.extend(2) == pytest.approx(2.0)
    assert lock_client.redis.pttl(permit.keys.holder(permit.owner or "")) <= 2000
    permit.release()


def test_the_admin_lists_one_row_per_permit_and_clears_by_token(lock_client: LockClient) -> None:
    sem = lock_client.semaphore("admin-sem", 3)
    a = sem.permit(owner_info={"task_name": "export", "task_id": "t-1"})
    b = sem.permit()
    assert a.acquire() and b.acquire()
    infos = [info for info in lock_client.locks("admin-*") if info.kind == "semaphore"]
    assert sorted(info.token or 0 for info in infos) == sorted([a.token or 0, b.token or 0])
    assert all(info.name == "admin-sem" and info.limit == 3 for info in infos)
    assert all(info.state == "live" and info.mode is None and info.lo is None for info in infos)
    [info_a] = [info for info in infos if info.token == a.token]
    assert (info_a.task_name, info_a.task_id, info_a.pid) == ("export", "t-1", os.getpid())
    assert info_a.to_dict()["limit"] == 3
    # A live permit is cleared only with force; by token, the other one stays.
    with pytest.raises(LockError):
        lock_client.clear("admin-sem", token=a.token)
    assert lock_client.clear("admin-sem", token=a.token, force=True)
    assert [info.token for info in lock_client.locks("admin-sem")] == [b.token]
    with pytest.raises(LockExpired):
        a.release()  # it finds its permit gone
    assert lock_client.clear("admin-sem", force=True)
    assert lock_client.locks("admin-sem") == []
    with sem.permit() as permit:
        assert permit.held


def test_a_stale_permit_is_cleared_without_force(lock_client: LockClient) -> None:
    permit = lock_client.semaphore("stale-sem", 2).permit(ttl=30)
    assert permit.acquire()
    # Its heartbeat ticks every 10 s: set its last renewal back past two missed ticks, as
    # a holder whose process froze would look.
    holder = permit.keys.holder(permit.owner or "")
    lock_client.redis.hset(holder, "renewed_ms", lock_client.server_ms() - 25_000)
    [info] = lock_client.locks("stale-sem")
    assert (info.state, info.evidence) == ("stale", "heartbeat stopped")
    assert lock_client.clear("stale-sem")
    assert lock_client.locks("stale-sem") == []


def test_release_holder_frees_a_dead_runs_permit(lock_client: LockClient) -> None:
    sem = lock_client.semaphore("dead-run", 1)
    permit = sem.permit(owner_info={"task_id": "run-1"})
    assert permit.acquire()
    assert not permit.release_holder(task_id="run-2", pid=os.getpid())
    assert permit.release_holder(task_id="run-1", pid=os.getpid())
    assert sem.permit().acquire()


def test_every_key_expires(lock_client: LockClient) -> None:
    sem = lock_client.semaphore("keys", 1)
    assert sem.permit().acquire()
    blocked = sem.permit()
    assert try_acquire(blocked, "waiting-owner", True) == (False, pytest.approx(30_000, abs=500))
    # The locks' keys (in hash tags): the prefix's key layout record is meant to stay.
    keys = lock_client.redis.keys(lock_client.prefix + "{*")
    assert len(keys) >= 4  # expiry index, holder hash, fencing counter, waiter's mark
    assert all(lock_client.redis.pttl(key) > 0 for key in keys)


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "3", None, math.inf])
def test_a_bad_limit_is_refused_before_any_redis_call(limit: Any) -> None:
    client = LockClient.from_url("redis://127.0.0.1:1/0")  # nothing listens there
    with pytest.raises(ConfigurationError) as info:
        client.semaphore("x", limit)
    assert info.value.argument == "limit"


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"ttl": 0}, "ttl"),
        ({"wait": -1}, "wait"),
        ({"max_hold": 1, "ttl": 5}, "max_hold"),
        ({"heartbeat": 1}, "heartbeat"),
        ({"on_lost": 3}, "on_lost"),
        ({"owner_info": [1]}, "owner_info"),
    ],
)
def test_bad_permit_options_are_refused_before_any_redis_call(
    options: dict[str, Any], argument: str
) -> None:
    client = LockClient.from_url("redis://127.0.0.1:1/0")
    with pytest.raises(ConfigurationError) as info:
        client.semaphore("x", 2).permit(**options)
    assert info.value.argument == argument
    with pytest.raises(ConfigurationError) as info:
        client.semaphore("", 2)
    assert info.value.argument == "name"


def test_names_and_repr(lock_client: LockClient) -> None:
    sem = lock_client.semaphore("r", 2)
    assert isinstance(sem, Semaphore) and repr(sem) == "<Semaphore 'r' limit=2>"
    permit = sem.permit()
    assert isinstance(permit, Permit) and permit.kind == "semaphore"
    assert repr(permit) == "<Permit 'r' of 2 free>"
    with permit:
        assert repr(permit) == "<Permit 'r' of 2 held>"


def test_one_round_trip_per_uncontended_acquire_and_per_release(
    lock_client: LockClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    sem = lock_client.semaphore("trips", 2)
    warm = sem.permit(heartbeat=False)
    assert warm.acquire()  # loads the scripts
    warm.release()
    sent: list[Any] = []
    execute = lock_client.redis.execute_command

    def counted(*args: Any, **kwargs: Any) -> Any:
        sent.append(args[0])
        return execute(*args, **kwargs)

    monkeypatch.setattr(lock_client.redis, "execute_command", counted)
    permit = sem.permit(heartbeat=False)
    assert permit.acquire()
    assert sent == ["EVALSHA"]
    permit.release()
    assert sent == ["EVALSHA", "EVALSHA"]
