"""Operations other than the first acquire whose reply is lost: sent again, or raised.

A proxy in front of the tests' Redis keeps the reply of one call from the client
(support/proxies.py): the call ran on the server, and the client's read runs into its socket
timeout. With a retry policy (``retries=1``) redis-py sends the same call again: that must
have the effect of one call (no second permit, no second claim or message, the same token).
With none (``retries=0``) the call raises LockBackendError: the state left must be clear,
either undone or still known to the handle, so that the caller's own retry works.

Handles are made without a heartbeat, so that the reply held back is the operation's own;
each operation runs once on a warm-up handle first (connection open, scripts loaded). The
reader-writer lock's operations are in test_lost_replies_rw.py; the task layer's steps in
test_task_lost_replies.py.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
from support.lost_replies import async_proxied_client, fence, proxied_client, reply_lost
from support.proxies import HoldingProxy

from celery_singleton_lock import (
    LockBackendError,
    LockClient,
    LockLost,
    ReleaseResult,
)
from celery_singleton_lock.core.keys import lock_keys
from celery_singleton_lock.kinds import multi

#: Makers of a handle of each kind on "n" (the multi-key lock also holds "n2"); the
#: semaphore has a limit of 1 here, so that a stranger's permit tells whether one is held.
KINDS: dict[str, Callable[[Any], Any]] = {
    "lease": lambda c: c.lease("n", ttl=30, heartbeat=False),
    "semaphore": lambda c: c.semaphore("n", 1).permit(ttl=30, heartbeat=False),
    "range-write": lambda c: c.range_lock("n").write(0, 10, ttl=30, heartbeat=False),
    "range-read": lambda c: c.range_lock("n").read(0, 10, ttl=30, heartbeat=False),
    "multi": lambda c: c.multi(["n", "n2"], ttl=30, heartbeat=False),
}

#: What a stranger is refused while a handle of each kind holds "n".
STRANGERS: dict[str, Callable[[Any], Any]] = {
    **KINDS,
    "range-read": lambda c: c.range_lock("n").write(5, 15, ttl=30, heartbeat=False),
}


def free(lock_client: LockClient, kind: str) -> bool:
    """Whether a stranger in the way of ``kind`` takes "n" at once (and gives it back)."""
    handle = STRANGERS[kind](lock_client)
    taken = bool(handle.acquire(0))
    if taken:
        handle.release()
    return taken


def warm(client: LockClient, kind: str, *, extend: bool = False, shrink: bool = False) -> None:
    """Run the operations the test then loses a reply of once, on a handle of ``kind``."""
    handle = KINDS[kind](client)
    assert handle.acquire()
    if extend:
        handle.extend(20)
    if shrink:
        handle.shrink(2, 8)
    handle.release()


def pttl_s(lock_client: LockClient, kind: str, name: str = "n") -> float:
    """Seconds left of what holds ``name`` (the lease key, or the interval holds' set)."""
    keys = lock_keys(lock_client.prefix, name)
    if kind in ("lease", "multi"):
        return float(lock_client.redis.pttl(keys.lock)) / 1000
    (info,) = [info for info in lock_client.locks(name) if info.owner]
    assert info.lease_remaining_s is not None
    return info.lease_remaining_s


# -- acquire -----------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_permit_acquire_sent_again_takes_one_permit(
    lock_client: LockClient, proxy: HoldingProxy
) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm(client, "semaphore")
        permit = client.semaphore("n", 2).permit(ttl=30, heartbeat=False)
        proxy.hold_next_reply()
        assert permit.acquire()  # the first run's reply held back; the retry's answered
        assert proxy.holding.is_set()
        assert permit.held and permit.token == fence(lock_client, "n")
        listed = [info for info in lock_client.locks("n") if info.kind == "semaphore"]
        assert [info.token for info in listed] == [permit.token]
        # One of the two permits is left, not none.
        second = lock_client.semaphore("n", 2).permit(heartbeat=False)
        assert second.acquire(0)
        assert not lock_client.semaphore("n", 2).permit(heartbeat=False).acquire(0)
        second.release()
        permit.release()
        assert lock_client.locks("n") == []
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["semaphore", "range-read"])
def test_an_acquire_sent_again_holds_with_its_token(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm(client, kind)
        handle = KINDS[kind](client)
        proxy.hold_next_reply()
        assert handle.acquire()
        assert proxy.holding.is_set()
        assert handle.held and handle.token == fence(lock_client, "n")
        assert len([info for info in lock_client.locks("n") if info.owner]) == 1
        assert not free(lock_client, kind)
        handle.release()
        assert free(lock_client, kind)
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["semaphore", "range-read"])
def test_an_acquire_that_raised_leaves_the_name_free(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm(client, kind)
        handle = KINDS[kind](client)
        with reply_lost(proxy):
            handle.acquire()
        assert not handle.held
        assert free(lock_client, kind)  # undone, not left to run out in 30 s
        assert lock_client.locks("n") == []
    finally:
        client.close()


# -- release -----------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["lease", "multi"])
def test_a_release_sent_again_is_one_release(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    """The first run freed the name and left its trace behind (its hash, renamed
    ``P{T}:freed``), which the second run
    finds: released, not LockExpired (nor LockTaken had another taken the name in between).
    The holds of semaphores, range and reader-writer locks leave theirs in their own hash
    (test_lost_replies_rw.py)."""
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm(client, kind)
        handle = KINDS[kind](client)
        assert handle.acquire()
        proxy.hold_next_reply()
        handle.release()  # the retry finds it released by the first run: not an error
        assert proxy.holding.is_set()
        assert not handle.held and not handle.lost
        assert free(lock_client, kind)
        assert handle.acquire()  # the handle is reusable
        handle.release()
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["lease", "multi"])
def test_a_release_that_raised_then_sent_by_the_caller_is_a_release(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    """The caller's retry of a release whose reply was lost, with nothing in between: the
    first run's trace says it was this release that freed the name."""
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm(client, kind)
        handle = KINDS[kind](client)
        assert handle.acquire()
        with reply_lost(proxy):
            handle.release()
        assert handle.held  # it keeps the owner token for the retry
        handle.release()
        assert not handle.held and not handle.lost
        assert free(lock_client, kind)
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_release_owner_sent_again_says_released(
    lock_client: LockClient, proxy: HoldingProxy
) -> None:
    """A claim released by its owner token, which passes no fencing token: the retry finds
    the first run's trace by that owner and answers released, not "not held"."""
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        assert client.release_owner("n", "claim:t0:0") is ReleaseResult.NOT_HELD  # warm-up
        assert lock_client.lease("n", owner="claim:t1:0", heartbeat=False).acquire()
        proxy.hold_next_reply()
        assert client.release_owner("n", "claim:t1:0") is ReleaseResult.RELEASED
        assert proxy.holding.is_set()
        assert free(lock_client, "lease")
        # The trace answers only the owner that left it.
        assert client.release_owner("n", "claim:t1:1") is ReleaseResult.NOT_HELD
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["semaphore", "range-read"])
def test_a_release_sent_by_the_caller_after_another_release_is_still_a_release(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    """A permit's or a range hold's release leaves its trace in the hold's own hash, which
    another hold's release in between (a stranger's) does not touch, where a lease's one
    trace per name is replaced by the next release (tests/test_acquire_retries.py)."""
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm(client, kind)
        handle = KINDS[kind](client)
        assert handle.acquire()
        proxy.hold_next_reply()
        with pytest.raises(LockBackendError):
            handle.release()
        assert free(lock_client, kind)
        handle.release()
        assert not handle.held and not handle.lost
    finally:
        client.close()


# -- extend ------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_extend_sent_again_extends_once(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm(client, kind, extend=True)
        handle = KINDS[kind](client)
        assert handle.acquire()
        proxy.hold_next_reply()
        assert handle.extend(100) == pytest.approx(100, abs=2)
        assert proxy.holding.is_set()
        assert handle.held and not handle.lost
        assert 95 < pttl_s(lock_client, kind) <= 100  # set to 100 s, not 200
        if kind == "multi":
            assert 95 < pttl_s(lock_client, kind, "n2") <= 100
        handle.release()
        assert free(lock_client, kind)
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_extend_that_raised_leaves_the_handle_holding(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm(client, kind, extend=True)
        handle = KINDS[kind](client)
        assert handle.acquire()
        with reply_lost(proxy):
            handle.extend(100)
        assert handle.held and not handle.lost
        assert not free(lock_client, kind)
        assert handle.extend(50) == pytest.approx(50, abs=2)  # the caller's retry works
        assert 45 < pttl_s(lock_client, kind) <= 50
        handle.release()
        assert free(lock_client, kind)
    finally:
        client.close()


# -- shrink ------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["range-write", "range-read"])
def test_a_shrink_sent_again_is_one_shrink(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm(client, kind, shrink=True)
        handle = KINDS[kind](client)
        assert handle.acquire()
        proxy.hold_next_reply()
        handle.shrink(2, 8)
        assert proxy.holding.is_set()
        assert handle.held and (handle.lo, handle.hi) == (2, 8)
        (info,) = lock_client.locks("n")
        assert (info.lo, info.hi) == (2, 8)
        outside = lock_client.range_lock("n").write(9, 10, heartbeat=False)
        assert outside.acquire(0)  # what the shrink let go of is free
        outside.release()
        handle.release()
        assert free(lock_client, kind)
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["range-write", "range-read"])
def test_a_shrink_that_raised_can_be_sent_again_by_the_caller(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm(client, kind, shrink=True)
        handle = KINDS[kind](client)
        assert handle.acquire()
        with reply_lost(proxy):
            handle.shrink(2, 8)
        assert handle.held and not handle.lost
        # It may have run: the handle claims only what it holds either way.
        assert (handle.lo, handle.hi) == (2, 8)
        handle.shrink(2, 8)  # the caller's retry
        assert (handle.lo, handle.hi) == (2, 8)
        (info,) = lock_client.locks("n")
        assert (info.lo, info.hi) == (2, 8)
        handle.release()
        assert free(lock_client, kind)
    finally:
        client.close()


# -- the admin side ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("delay", [0, 60])
def test_a_release_holder_sent_again_frees_it_once_and_says_so(
    lock_client: LockClient, proxy: HoldingProxy, delay: float
) -> None:
    """A supervisor freeing its dead child's lease: the first run freed it (or left its
    release delay), and the second finds that done by it and answers True."""
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        assert not client.release_holder("warm-up", task_id="t0", pid=os.getpid())
        held = lock_client.lease("n", heartbeat=False, owner_info={"task_id": "t1"})
        assert held.acquire()
        proxy.hold_next_reply()
        assert client.release_holder("n", task_id="t1", pid=os.getpid(), delay=delay)
        assert proxy.holding.is_set()
        # What it left tells no other process it released, nor the holder that it did.
        assert not client.release_holder("n", task_id="t1", pid=os.getpid() + 1)
        with pytest.raises(LockLost):
            held.release()
        assert free(lock_client, "lease") == (delay == 0)
        if delay:
            (info,) = lock_client.locks("n")
            assert info.owner is None and 55 < (info.lease_remaining_s or 0) <= 60
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["lease", "multi"])
def test_a_clear_sent_again_says_it_cleared(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        names = ["n", "n2"] if kind == "multi" else ["n"]
        warm_up = KINDS[kind](lock_client)
        assert warm_up.acquire()
        assert all([client.clear(name, force=True) for name in names])
        held = KINDS[kind](lock_client)
        assert held.acquire()
        proxy.hold_next_script_reply()  # the listing's replies come through
        assert client.clear("n", force=True)
        assert proxy.holding.is_set()
        assert all([client.clear(name, force=True) for name in names[1:]])
        assert free(lock_client, kind)
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("token", [False, True])
def test_a_multi_clear_holder_sent_again_says_it_cleared(
    lock_client: LockClient, proxy: HoldingProxy, token: bool
) -> None:
    """One name of a multi-key lock cleared by its owner token: the retry finds the trace
    the first run left (as client.clear's), not a name gone; the holder's own release
    still finds the name lost, not released."""
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm_up = lock_client.multi(["w", "w2"], ttl=30, heartbeat=False)
        assert warm_up.acquire()
        assert multi.clear_holder(client, "w", warm_up.owner or "")
        held = KINDS["multi"](lock_client)
        assert held.acquire()
        fencing = held.tokens["n"] if token else None
        proxy.hold_next_script_reply()  # the read of the holder comes through
        assert multi.clear_holder(client, "n", held.owner or "", fencing)
        assert proxy.holding.is_set()
        assert free(lock_client, "lease")
        with pytest.raises(LockLost):
            held.release()
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["lease", "multi"])
def test_a_holder_whose_lease_was_cleared_finds_it_lost_on_release(
    lock_client: LockClient, kind: str
) -> None:
    """What a clear leaves for its own retry is no release of the holder's."""
    handle = KINDS[kind](lock_client)
    assert handle.acquire()
    assert lock_client.clear("n", force=True)
    with pytest.raises(LockLost):
        handle.release()


# -- asyncio -----------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_an_async_permit_acquire_sent_again_takes_one_permit(
    lock_client: LockClient, proxy: HoldingProxy
) -> None:
    async def body() -> None:
        client = async_proxied_client(lock_client, proxy, retries=1)
        try:
            warm_up = client.semaphore("n", 2).permit(heartbeat=False)
            assert await warm_up.acquire()
            await warm_up.release()
            permit = client.semaphore("n", 2).permit(ttl=30, heartbeat=False)
            proxy.hold_next_reply()
            assert await permit.acquire()
            assert proxy.holding.is_set()
            assert permit.token == fence(lock_client, "n")
            second = lock_client.semaphore("n", 2).permit(heartbeat=False)
            assert second.acquire(0)
            assert not lock_client.semaphore("n", 2).permit(heartbeat=False).acquire(0)
            second.release()
            await permit.release()
            assert lock_client.locks("n") == []
        finally:
            await client.close()

    asyncio.run(body())


@pytest.mark.timeout(60)
def test_an_async_multi_release_sent_again_is_one_release(
    lock_client: LockClient, proxy: HoldingProxy
) -> None:
    async def body() -> None:
        client = async_proxied_client(lock_client, proxy, retries=1)
        try:
            for _ in range(2):  # warm-up, then the release whose reply is lost
                handle = client.multi(["n", "n2"], ttl=30, heartbeat=False)
                assert await handle.acquire()
                proxy.hold_next_reply() if _ else None
                await handle.release()
            assert proxy.holding.is_set()
            assert not handle.held and not handle.lost
            assert free(lock_client, "multi")
        finally:
            await client.close()

    asyncio.run(body())


# -- the fair queue ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runner", ["sync", "asyncio"])
def test_a_fair_wait_whose_unanswered_withdrawal_found_the_lease_handed_over_holds_nothing(
    lock_client: LockClient, proxy: HoldingProxy, runner: str
) -> None:
    """The wait runs out; a release hands the lease to the waiter, still queued, just before
    its withdrawal (fair_abandon.lua) runs, and the withdrawal's reply, which says the lease
    is the waiter's, is lost. The acquire raises LockBackendError with the lease given back,
    not False with the name held, unrenewed, for the waiter's ttl."""
    holder = lock_client.lease("n", ttl=30, heartbeat=False)
    assert holder.acquire()
    withdrawal = lock_client.connection.scripts.fair_abandon_call(holder.keys.lock, "")[0]
    queue = holder.keys.base + b"queue"

    def hand_over_before_the_withdrawal() -> None:
        assert proxy.stopped.wait(10), "the withdrawal did not come"
        holder.release()  # the waiter is still queued: the lease is handed to it
        proxy.let_through()

    def arm() -> threading.Thread:
        proxy.stop_next_call(withdrawal.sha.encode())
        helper = threading.Thread(target=hand_over_before_the_withdrawal, daemon=True)
        helper.start()
        return helper

    if runner == "sync":
        client = proxied_client(lock_client, proxy, retries=0)
        try:
            # The scripts loaded: a fair wait that runs out, withdrawn.
            assert not client.lease("n", ttl=30, heartbeat=False, fair=True).acquire(0.1)
            waiter = client.lease("n", ttl=30, heartbeat=False, fair=True)
            helper = arm()
            with pytest.raises(LockBackendError):
                waiter.acquire(0.3)
            assert not waiter.held
        finally:
            client.close()
    else:

        async def body() -> threading.Thread:
            client = async_proxied_client(lock_client, proxy, retries=0)
            try:
                warm_up = client.lease("n", ttl=30, heartbeat=False, fair=True)
                assert not await warm_up.acquire(0.1)
                waiter = client.lease("n", ttl=30, heartbeat=False, fair=True)
                helper = arm()
                with pytest.raises(LockBackendError):
                    await waiter.acquire(0.3)
                assert not waiter.held
                return helper
            finally:
                await client.close()

        helper = asyncio.run(body())
    helper.join(10)
    assert proxy.holding.is_set()  # the withdrawal ran, and its reply was lost
    assert free(lock_client, "lease")  # given back, not left to run out in 30 s
    assert lock_client.redis.llen(queue) == 0
