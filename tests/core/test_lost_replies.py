"""Lost replies: an operation whose reply was lost answers, when sent again, what it answered
the first time, and leaves nothing behind it would not have left.

A reply is lost when the script ran on Redis and its answer never reached the client: a proxy
in front of the tests' Redis holds it back (support/proxies.py), and the client's read runs
into its socket timeout (0.5 s). Then either

* redis-py sends the same call again (``retries=1``): the operation answers what its first
  run did, with the same token, and has the effect of one run: one permit, one extension to
  the ttl asked, one release, one clear; or
* nothing is sent again (``retries=0``): the operation raises LockBackendError, and what its
  run did is either undone (an acquire) or still known to the handle, so that the caller's
  own retry is the same operation, answered as the first run would have been.

Each case runs for every kind of hold it applies to (``kind``), on the sync and the asyncio
client (``side``), with handles without a heartbeat (the reply held back is the operation's
own) and a client warmed up first (connection open, scripts loaded). The admin's calls on
one holder (release_holder, clear_holder, release_owner) run on the sync client only: most
have no asyncio form. Cases of one kind only follow the shared ones. More about the
acquire (claims, waits) is in test_acquire_retries.py; the task layer's steps are in
test_task_lost_replies.py.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support.async_sides import Side, eventually, run
from support.lost_replies import async_proxied_client, fence, proxied_client, reply_lost
from support.proxies import HoldingProxy

from celery_singleton_lock import (
    LockBackendError,
    LockClient,
    LockExpired,
    LockLost,
    ReleaseResult,
)
from celery_singleton_lock.core.keys import lock_keys
from celery_singleton_lock.kinds import multi, rangelock, rwlock, semaphore

#: Makers of a hold of each kind on ``name`` (the multi-key lock also holds ``name + "2"``);
#: the semaphore has a limit of 1, so that a stranger's permit tells whether one is held.
KINDS: dict[str, Callable[..., Any]] = {
    "lease": lambda c, name, **o: c.lease(name, **o),
    "multi": lambda c, name, **o: c.multi([name, name + "2"], **o),
    "read": lambda c, name, **o: c.rwlock(name).read(**o),
    "upgradable": lambda c, name, **o: c.rwlock(name).upgradable(**o),
    "write": lambda c, name, **o: c.rwlock(name).write(**o),
    "range-read": lambda c, name, **o: c.range_lock(name).read(0, 10, **o),
    "range-write": lambda c, name, **o: c.range_lock(name).write(0, 10, **o),
    "permit": lambda c, name, **o: c.semaphore(name, 1).permit(**o),
}
#: The holds of the interval engine: each keeps its own hash, and its release's trace there.
HOLDS = [kind for kind in KINDS if kind not in ("lease", "multi")]
RANGES = ["range-read", "range-write"]

#: What a stranger is refused while a hold of each kind is on "n".
STRANGERS: dict[str, Callable[[LockClient], Any]] = {
    **{kind: lambda c, kind=kind: make(c, kind) for kind in KINDS},
    "read": lambda c: c.rwlock("n").write(heartbeat=False),
    "upgradable": lambda c: c.rwlock("n").write(heartbeat=False),
    "range-read": lambda c: c.range_lock("n").write(5, 15, heartbeat=False),
}

#: What a holder's own release raises once its hold was taken from it.
LOST: dict[str, type[LockLost]] = {kind: LockExpired for kind in HOLDS}
LOST.update(lease=LockLost, multi=LockLost)

#: The admin's calls on one holder of each kind, by its owner token.
CLEAR_HOLDER: dict[str, Callable[..., bool]] = {
    "multi": multi.clear_holder,
    **{kind: rwlock.clear_holder for kind in ("read", "upgradable", "write")},
    **{kind: rangelock.clear_holder for kind in RANGES},
    "permit": semaphore.clear_holder,
}
#: The supervisor's release of a dead task's hold, by its task id and process.
RELEASE_HOLDER: dict[str, Callable[..., bool]] = {
    "lease": lambda c, name, **o: c.release_holder(name, **o),
    **{kind: rwlock.release_holder for kind in ("read", "upgradable", "write")},
    **{kind: rangelock.release_holder for kind in RANGES},
    "permit": semaphore.release_holder,
}


def make(client: Any, kind: str, name: str = "n", **options: Any) -> Any:
    """A handle of ``kind`` on ``name``: a lease of 30 s, no heartbeat, unless ``options``."""
    return KINDS[kind](client, name, **{"ttl": 30, "heartbeat": False, **options})


@pytest.fixture(params=["sync", "async"])
def side(request: pytest.FixtureRequest) -> str:
    """The client the operations go through: the sync one or the asyncio one."""
    return str(request.param)


def through_proxy(
    lock_client: LockClient,
    proxy: HoldingProxy,
    side: str,
    body: Callable[[Side], Awaitable[None]],
    *,
    retries: int,
    socket_timeout: float = 0.5,
) -> None:
    """Run ``body`` on a new event loop with a client of ``side`` through ``proxy`` that
    sends a call whose reply was held back ``retries`` times again, then raises."""

    async def main() -> None:
        client = Side(side, proxy.url, lock_client.prefix)
        if side == "sync":
            client.client = proxied_client(lock_client, proxy, retries)
        else:
            client.client = async_proxied_client(lock_client, proxy, retries, socket_timeout)
        try:
            await body(client)
        finally:
            await client.close()

    run(main())


async def call(client: Side, method: str, *args: Any, **kwargs: Any) -> Any:
    """``client.<method>(...)`` of either side, awaited."""
    bound = getattr(client.client, method)
    if client.kind == "sync":
        return await asyncio.to_thread(bound, *args, **kwargs)
    return await bound(*args, **kwargs)


async def warm(client: Side, kind: str) -> None:
    """Run every operation of ``kind`` once: the connection open, the scripts loaded."""
    handle = make(client, kind)
    assert await handle.acquire()
    await handle.extend(20)
    if kind in RANGES:
        await handle.shrink(2, 8)
    if kind == "upgradable":
        assert await handle.upgrade(0)
        await handle.downgrade()
    await handle.release()


def fencing(handle: Any) -> int:
    """The fencing token ``handle`` holds "n" with."""
    tokens = getattr(handle, "tokens", None)
    return int(tokens["n"] if isinstance(tokens, dict) else handle.token)


def free(lock_client: LockClient, kind: str) -> bool:
    """Whether a stranger in the way of ``kind`` takes "n" at once (and gives it back)."""
    stranger = STRANGERS[kind](lock_client)
    taken = bool(stranger.acquire(0))
    if taken:
        stranger.release()
    return taken


def reader_free(lock_client: LockClient) -> bool:
    """Whether a reader gets into the reader-writer lock "n" at once (and goes)."""
    reader = lock_client.rwlock("n").read(heartbeat=False)
    taken = bool(reader.acquire(0))
    if taken:
        reader.release()
    return taken


def owners(lock_client: LockClient) -> int:
    """How many holders "n" lists (a release's or a clear's trace is not one)."""
    return len([info for info in lock_client.locks("n") if info.owner])


def remaining_s(lock_client: LockClient, kind: str, name: str = "n") -> float:
    """Seconds left of the hold on ``name`` (the lease key, or the hold in its hash)."""
    if kind in ("lease", "multi"):
        return float(lock_client.redis.pttl(lock_keys(lock_client.prefix, name).lock)) / 1000
    (info,) = [info for info in lock_client.locks(name) if info.owner]
    assert info.lease_remaining_s is not None
    return info.lease_remaining_s


# -- acquire ------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_acquire_sent_again_holds_with_the_token_it_took(
    lock_client: LockClient, proxy: HoldingProxy, side: str, kind: str
) -> None:
    async def body(client: Side) -> None:
        await warm(client, kind)
        handle = make(client, kind)
        proxy.hold_next_reply()
        assert await handle.acquire()  # the first run's reply held back; the retry's answered
        assert proxy.holding.is_set()
        assert handle.held and fencing(handle) == fence(lock_client, "n")
        assert owners(lock_client) == 1
        assert not free(lock_client, kind)
        await handle.release()
        assert free(lock_client, kind)

    through_proxy(lock_client, proxy, side, body, retries=1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_acquire_that_raised_is_undone(
    lock_client: LockClient, proxy: HoldingProxy, side: str, kind: str
) -> None:
    async def body(client: Side) -> None:
        await warm(client, kind)
        handle = make(client, kind)
        with reply_lost(proxy):
            await handle.acquire()
        assert not handle.held
        assert lock_client.locks("n") == []  # undone, not left to run out in 30 s
        assert free(lock_client, kind)

    through_proxy(lock_client, proxy, side, body, retries=0)


#: Holds taken under a call identity (the ``call`` option); the semaphore has room for two.
CALLED: dict[str, Callable[[Any], Any]] = {
    "read": lambda c: c.rwlock("n").read(ttl=30, heartbeat=False, call="call-1"),
    "range-read": lambda c: c.range_lock("n").read(0, 10, ttl=30, heartbeat=False, call="call-1"),
    "permit": lambda c: c.semaphore("n", 2).permit(ttl=30, heartbeat=False, call="call-1"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(CALLED))
def test_an_acquire_with_a_call_sent_again_is_not_refused_by_its_own_hold(
    lock_client: LockClient, proxy: HoldingProxy, side: str, kind: str
) -> None:
    """The first run took the hold under the call; the second is that attempt again,
    answered with its token, not refused as another delivery of the call."""

    async def body(client: Side) -> None:
        warm_up = CALLED[kind](client)
        assert await warm_up.acquire()
        await warm_up.release()
        handle = CALLED[kind](client)
        proxy.hold_next_reply()
        assert await handle.acquire()
        assert proxy.holding.is_set()
        assert handle.held and not handle.held_by_call
        assert handle.token == fence(lock_client, "n")
        copy = CALLED[kind](lock_client)
        assert not copy.acquire() and copy.held_by_call
        await handle.release()

    through_proxy(lock_client, proxy, side, body, retries=1)


@pytest.mark.timeout(60)
def test_a_permit_acquire_sent_again_takes_one_of_the_permits(
    lock_client: LockClient, proxy: HoldingProxy, side: str
) -> None:
    async def body(client: Side) -> None:
        warm_up = client.semaphore("n", 2).permit(heartbeat=False)
        assert await warm_up.acquire()
        await warm_up.release()
        permit = client.semaphore("n", 2).permit(ttl=30, heartbeat=False)
        proxy.hold_next_reply()
        assert await permit.acquire()
        assert proxy.holding.is_set()
        assert permit.held and permit.token == fence(lock_client, "n")
        assert [info.token for info in lock_client.locks("n")] == [permit.token]
        # One of the two permits is left, not none.
        second = lock_client.semaphore("n", 2).permit(heartbeat=False)
        assert second.acquire(0)
        assert not lock_client.semaphore("n", 2).permit(heartbeat=False).acquire(0)
        second.release()
        await permit.release()
        assert lock_client.locks("n") == []

    through_proxy(lock_client, proxy, side, body, retries=1)


# -- release ------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_release_sent_again_is_one_release(
    lock_client: LockClient, proxy: HoldingProxy, side: str, kind: str
) -> None:
    """The first run freed the hold and left its trace (a lease's hash renamed
    ``P{T}:freed``; an interval hold's own hash marked released), which the second run
    finds: released, not LockExpired, nor LockTaken had another taken the name between."""

    async def body(client: Side) -> None:
        await warm(client, kind)
        handle = make(client, kind)
        assert await handle.acquire()
        proxy.hold_next_reply()
        await handle.release()
        assert proxy.holding.is_set()
        assert not handle.held and not handle.lost
        assert free(lock_client, kind)
        assert await handle.acquire()  # the handle is reusable
        await handle.release()

    through_proxy(lock_client, proxy, side, body, retries=1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_release_that_raised_keeps_the_owner_for_the_callers_retry(
    lock_client: LockClient, proxy: HoldingProxy, side: str, kind: str
) -> None:
    """The caller's retry, with nothing in between: the first run's trace says it was this
    release that freed the hold."""

    async def body(client: Side) -> None:
        await warm(client, kind)
        handle = make(client, kind)
        assert await handle.acquire()
        with reply_lost(proxy):
            await handle.release()
        assert handle.held  # it keeps the owner token for the retry
        await handle.release()
        assert not handle.held and not handle.lost
        assert free(lock_client, kind)

    through_proxy(lock_client, proxy, side, body, retries=0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", HOLDS)
def test_a_hold_release_that_raised_is_still_a_release_after_a_strangers(
    lock_client: LockClient, proxy: HoldingProxy, side: str, kind: str
) -> None:
    """An interval hold's release leaves its trace in the hold's own hash, which another
    hold's release in between does not touch (a lease's one trace per name is replaced by
    the next release: test_acquire_retries.py)."""

    async def body(client: Side) -> None:
        await warm(client, kind)
        handle = make(client, kind)
        assert await handle.acquire()
        with reply_lost(proxy):
            await handle.release()
        assert free(lock_client, kind)  # a stranger takes the name and releases it
        await handle.release()
        assert not handle.held and not handle.lost

    through_proxy(lock_client, proxy, side, body, retries=0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", HOLDS)
def test_a_hold_release_sent_again_after_the_hold_ran_out_raises(
    lock_client: LockClient, proxy: HoldingProxy, side: str, kind: str
) -> None:
    """The trace of a release lasts what the hold had left: a release sent again once that
    is over cannot tell its first run from an expiry, and says so (fail closed)."""

    async def body(client: Side) -> None:
        await warm(client, kind)
        handle = make(client, kind, ttl=1)
        assert await handle.acquire()
        trace = handle.keys.holder(handle.owner)
        with reply_lost(proxy):
            await handle.release()
        assert lock_client.redis.hget(trace, "state") == b"released"
        assert owners(lock_client) == 0  # a trace is not listed as a hold
        await eventually(lambda: not lock_client.redis.exists(trace), 10, "the trace to go")
        with pytest.raises(LockExpired, match="earlier release"):
            await handle.release()

    through_proxy(lock_client, proxy, side, body, retries=0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("retry_delay", [60, 0])
@pytest.mark.parametrize("kind", HOLDS)
def test_a_delayed_hold_release_sent_again_leaves_the_delay_where_it_was(
    lock_client: LockClient, proxy: HoldingProxy, side: str, kind: str, retry_delay: int
) -> None:
    """The caller's retry may come with the delay or without: either way the hold is in
    its delay already, and a release delay holds whatever its holder calls afterwards."""

    async def body(client: Side) -> None:
        await warm(client, kind)
        handle = make(client, kind)
        assert await handle.acquire()
        hold = handle.keys.holder(handle.owner)
        with reply_lost(proxy):
            await handle.release(60)
        redis = lock_client.redis
        released_ms, left_ms = redis.hget(hold, "released_ms"), redis.pttl(hold)
        assert released_ms is not None
        await handle.release(retry_delay)
        assert not handle.held and not handle.lost
        assert redis.hget(hold, "released_ms") == released_ms
        assert 0 < redis.pttl(hold) <= left_ms
        assert not free(lock_client, kind)

    through_proxy(lock_client, proxy, side, body, retries=0)


# -- extend and shrink --------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_extend_sent_again_extends_once(
    lock_client: LockClient, proxy: HoldingProxy, side: str, kind: str
) -> None:
    async def body(client: Side) -> None:
        await warm(client, kind)
        handle = make(client, kind)
        assert await handle.acquire()
        proxy.hold_next_reply()
        assert await handle.extend(100) == pytest.approx(100, abs=2)
        assert proxy.holding.is_set()
        assert handle.held and not handle.lost
        assert 95 < remaining_s(lock_client, kind) <= 100  # set to 100 s, not 200
        if kind == "multi":
            assert 95 < remaining_s(lock_client, kind, "n2") <= 100
        await handle.release()
        assert free(lock_client, kind)

    through_proxy(lock_client, proxy, side, body, retries=1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_extend_that_raised_leaves_the_handle_holding(
    lock_client: LockClient, proxy: HoldingProxy, side: str, kind: str
) -> None:
    async def body(client: Side) -> None:
        await warm(client, kind)
        handle = make(client, kind)
        assert await handle.acquire()
        with reply_lost(proxy):
            await handle.extend(100)
        assert handle.held and not handle.lost
        assert not free(lock_client, kind)
        assert await handle.extend(50) == pytest.approx(50, abs=2)  # the caller's retry
        assert 45 < remaining_s(lock_client, kind) <= 50
        await handle.release()
        assert free(lock_client, kind)

    through_proxy(lock_client, proxy, side, body, retries=0)


def shrunk(lock_client: LockClient) -> None:
    """The range hold on "n" is [2, 8], and what the shrink let go of is free."""
    (info,) = lock_client.locks("n")
    assert (info.lo, info.hi) == (2, 8)
    outside = lock_client.range_lock("n").write(9, 10, heartbeat=False)
    assert outside.acquire(0)
    outside.release()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", RANGES)
def test_a_shrink_sent_again_is_one_shrink(
    lock_client: LockClient, proxy: HoldingProxy, side: str, kind: str
) -> None:
    async def body(client: Side) -> None:
        await warm(client, kind)
        handle = make(client, kind)
        assert await handle.acquire()
        proxy.hold_next_reply()
        await handle.shrink(2, 8)
        assert proxy.holding.is_set()
        assert handle.held and (handle.lo, handle.hi) == (2, 8)
        shrunk(lock_client)
        await handle.release()
        assert free(lock_client, kind)

    through_proxy(lock_client, proxy, side, body, retries=1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", RANGES)
def test_a_shrink_that_raised_can_be_sent_again_by_the_caller(
    lock_client: LockClient, proxy: HoldingProxy, side: str, kind: str
) -> None:
    async def body(client: Side) -> None:
        await warm(client, kind)
        handle = make(client, kind)
        assert await handle.acquire()
        with reply_lost(proxy):
            await handle.shrink(2, 8)
        assert handle.held and not handle.lost
        # It may have run: the handle claims only what it holds either way.
        assert (handle.lo, handle.hi) == (2, 8)
        await handle.shrink(2, 8)  # the caller's retry
        assert (handle.lo, handle.hi) == (2, 8)
        shrunk(lock_client)
        await handle.release()
        assert free(lock_client, kind)

    through_proxy(lock_client, proxy, side, body, retries=0)


# -- upgrade and downgrade (the upgradable reader-writer hold) ----------------------------------


async def changed(handle: Any, change: str, lock_client: LockClient) -> None:
    """The hold is as ``change`` left it (the writer, or upgradable beside readers) and
    still held; an upgraded one downgrades; its release frees the lock."""
    assert handle.held and not handle.lost
    assert handle.upgraded == (change == "upgrade")
    assert reader_free(lock_client) == (change == "downgrade")
    assert not free(lock_client, "write")
    if change == "upgrade":
        await handle.downgrade()
        assert reader_free(lock_client)
    await handle.release()
    assert free(lock_client, "write")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("change", ["upgrade", "downgrade"])
def test_a_change_sent_again_is_one_change(
    lock_client: LockClient, proxy: HoldingProxy, side: str, change: str
) -> None:
    async def body(client: Side) -> None:
        await warm(client, "upgradable")
        handle = make(client, "upgradable")
        assert await handle.acquire()
        if change == "downgrade":
            assert await handle.upgrade(0)
        proxy.hold_next_reply()
        if change == "upgrade":
            assert await handle.upgrade(0)
        else:
            await handle.downgrade()
        assert proxy.holding.is_set()
        await changed(handle, change, lock_client)

    through_proxy(lock_client, proxy, side, body, retries=1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("change", ["upgrade", "downgrade"])
def test_a_change_that_raised_can_be_sent_again_by_the_caller(
    lock_client: LockClient, proxy: HoldingProxy, side: str, change: str
) -> None:
    async def body(client: Side) -> None:
        await warm(client, "upgradable")
        handle = make(client, "upgradable")
        assert await handle.acquire()
        if change == "downgrade":
            assert await handle.upgrade(0)
        with reply_lost(proxy):
            await getattr(handle, change)()
        assert handle.held and not handle.lost
        if change == "upgrade":  # the caller's retry
            assert await handle.upgrade(0)
        else:
            await handle.downgrade()
        await changed(handle, change, lock_client)

    through_proxy(lock_client, proxy, side, body, retries=0)


@pytest.mark.timeout(60)
def test_an_upgrade_after_a_downgrade_that_raised_asks_redis(
    lock_client: LockClient, proxy: HoldingProxy, side: str
) -> None:
    """The downgrade ran and its reply was lost: the hold is upgradable again, readers come
    in. The handle cannot tell that from a downgrade that never arrived, so it no longer
    takes itself for the writer: an upgrade asks Redis again, and no writer is beside a
    reader."""

    async def body(client: Side) -> None:
        await warm(client, "upgradable")
        handle = make(client, "upgradable")
        assert await handle.acquire()
        assert await handle.upgrade(0)
        with reply_lost(proxy):
            await handle.downgrade()
        reader = lock_client.rwlock("n").read(heartbeat=False)
        assert reader.acquire(0)  # the downgrade did run
        assert not await handle.upgrade(0)  # a reader holds: no writer beside it
        assert not handle.upgraded and handle.held
        reader.release()
        assert await handle.upgrade(0)
        assert not reader_free(lock_client)
        await handle.release()
        assert free(lock_client, "write")

    through_proxy(lock_client, proxy, side, body, retries=0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("change", ["upgrade", "downgrade"])
def test_a_release_after_a_change_that_raised_frees_the_hold_as_it_is(
    lock_client: LockClient, proxy: HoldingProxy, side: str, change: str
) -> None:
    """The change ran and its reply was lost; the context is left as its error goes by. The
    release frees the hold in the mode Redis has it in, not the one the handle last heard
    of: a downgraded hold is not released as the writer, which would keep its upgradable
    slot and block upgradables and writers until its lease ran out."""

    async def body(client: Side) -> None:
        await warm(client, "upgradable")
        handle = make(client, "upgradable")
        with pytest.raises(LockBackendError):
            async with handle:
                if change == "downgrade":
                    assert await handle.upgrade(0)
                proxy.hold_next_reply()
                await getattr(handle, change)()
        assert proxy.holding.is_set()
        assert not handle.held and not handle.lost
        assert owners(lock_client) == 0
        assert free(lock_client, "write")
        other = lock_client.rwlock("n").upgradable(heartbeat=False)
        assert other.acquire(0)
        other.release()

    through_proxy(lock_client, proxy, side, body, retries=0)


@pytest.mark.timeout(60)
def test_an_asyncio_downgrade_cancelled_after_it_ran_leaves_the_mode_unknown(
    lock_client: LockClient, proxy: HoldingProxy
) -> None:
    """asyncio only: the downgrade ran and the task was cancelled while its reply was
    awaited. As after LockBackendError, the handle no longer takes itself for the writer,
    and its release frees the hold as Redis has it."""

    async def body(client: Side) -> None:
        await warm(client, "upgradable")
        handle = make(client, "upgradable")
        assert await handle.acquire()
        assert await handle.upgrade(0)
        proxy.hold_next_reply()
        downgrade = asyncio.ensure_future(handle.downgrade())
        assert await asyncio.to_thread(proxy.holding.wait, 10)  # it ran
        downgrade.cancel()
        with pytest.raises(asyncio.CancelledError):
            await downgrade
        # What follows on fresh connections: under load, the call after the cancelled one
        # once waited out its timeout on the connection that read was cancelled on (a CI
        # run). Not what this test is about: the handle's mode after the cancellation is.
        await client.client.redis.connection_pool.disconnect()
        reader = lock_client.rwlock("n").read(heartbeat=False)
        assert reader.acquire(0)
        assert not await handle.upgrade(0)  # a reader holds: no writer beside it
        assert not handle.upgraded
        reader.release()
        await handle.release()
        assert free(lock_client, "write")

    # The reply held back is ended by the cancel, not by a timeout: a long one, so that a
    # loaded machine's slow thread hand-over is not taken for one.
    through_proxy(lock_client, proxy, "async", body, retries=0, socket_timeout=10)


# -- the admin side -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("by_token", [False, True])
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_clear_sent_again_says_it_cleared(
    lock_client: LockClient, proxy: HoldingProxy, side: str, kind: str, by_token: bool
) -> None:
    """What the clear left for its own retry (an interval hold's hash marked cleared) is
    neither a hold nor a release of the holder's: its release finds the hold lost."""

    def token(handle: Any, name: str) -> int | None:
        tokens = handle.tokens if kind == "multi" else {"n": handle.token}
        return tokens[name] if by_token else None

    names = ["n", "n2"] if kind == "multi" else ["n"]

    async def body(client: Side) -> None:
        warm_up = make(lock_client, kind)
        assert warm_up.acquire()
        for name in names:
            assert await call(client, "clear", name, token=token(warm_up, name), force=True)
        held = make(lock_client, kind)
        assert held.acquire()
        proxy.hold_next_script_reply()  # the listing's replies come through
        assert await call(client, "clear", "n", token=token(held, "n"), force=True)
        assert proxy.holding.is_set()
        for name in names[1:]:
            assert await call(client, "clear", name, token=token(held, name), force=True)
        assert owners(lock_client) == 0 and free(lock_client, kind)
        if kind in HOLDS:
            assert lock_client.redis.hget(held.keys.holder(held.owner), "cleared") == b"1"
        with pytest.raises(LOST[kind]):
            held.release()

    through_proxy(lock_client, proxy, side, body, retries=1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("by_token", [False, True])
@pytest.mark.parametrize("kind", list(CLEAR_HOLDER))
def test_a_clear_holder_sent_again_says_it_cleared(
    lock_client: LockClient, proxy: HoldingProxy, kind: str, by_token: bool
) -> None:
    """One holder cleared by its owner token (sync only): the retry finds the trace the
    first run left, not a hold gone; only the clear that freed it, by its fencing token,
    is answered so."""
    clear_holder = CLEAR_HOLDER[kind]
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm_up = make(lock_client, kind, "w")
        assert warm_up.acquire()
        assert clear_holder(client, "w", warm_up.owner, None)
        held = make(lock_client, kind)
        assert held.acquire()
        token = fencing(held) if by_token else None
        proxy.hold_next_script_reply()  # a read of the holder first comes through
        assert clear_holder(client, "n", held.owner, token)
        assert proxy.holding.is_set()
        assert owners(lock_client) == 0
        assert free(lock_client, "lease" if kind == "multi" else kind)  # "n2" is still held
        # Called again by hand, a multi-key lock's clear reads the holder first, finds none,
        # and answers False: only redis-py's retry of its script finds the trace.
        if kind in HOLDS:
            assert clear_holder(lock_client, "n", held.owner, token)
        if kind in HOLDS and token is not None:
            assert not clear_holder(lock_client, "n", held.owner, token + 1)
            assert clear_holder(lock_client, "n", held.owner, token)
        with pytest.raises(LOST[kind]):
            held.release()
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("delay", [0, 60])
@pytest.mark.parametrize("kind", list(RELEASE_HOLDER))
def test_a_release_holder_sent_again_frees_it_once_and_says_so(
    lock_client: LockClient, proxy: HoldingProxy, kind: str, delay: int
) -> None:
    """A supervisor freeing its dead child's hold (sync only): the first run freed it, or
    left its release delay, and the second finds that done by it and answers True. The
    delay runs from the first run: the retry went only after the socket timeout (0.5 s)."""
    release_holder = RELEASE_HOLDER[kind]
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm_up = make(lock_client, kind, "w", owner_info={"task_id": "t0"})
        assert warm_up.acquire()
        assert release_holder(client, "w", task_id="t0", pid=os.getpid())
        held = make(lock_client, kind, owner_info={"task_id": "t1"})
        assert held.acquire()
        seconds, micros = lock_client.redis.time()
        sent_ms = int(seconds) * 1000 + int(micros) // 1000
        proxy.hold_next_script_reply()
        assert release_holder(client, "n", task_id="t1", pid=os.getpid(), delay=delay)
        assert proxy.holding.is_set()
        # What it left tells no other process it released, nor the holder that it did.
        assert not release_holder(lock_client, "n", task_id="t1", pid=os.getpid() + 1)
        assert free(lock_client, kind) == (delay == 0)
        if delay and kind == "lease":
            (info,) = lock_client.locks("n")
            assert info.owner is None and 55 < (info.lease_remaining_s or 0) <= 59.5
        elif delay:
            released_ms = lock_client.redis.hget(held.keys.holder(held.owner), "released_ms")
            assert int(released_ms) - sent_ms < 500
        if delay and kind in HOLDS:
            held.release()  # an interval hold's release delay holds whatever its holder calls
            assert not free(lock_client, kind)
        else:
            with pytest.raises(LOST[kind]):
                held.release()
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_release_owner_sent_again_says_released(
    lock_client: LockClient, proxy: HoldingProxy
) -> None:
    """A lease claim released by its owner token (sync only), which passes no fencing
    token: the retry finds the first run's trace by that owner and answers released, not
    "not held"; the trace answers only the owner that left it."""
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        assert client.release_owner("n", "claim:t0:0") is ReleaseResult.NOT_HELD  # warm-up
        assert lock_client.lease("n", owner="claim:t1:0", heartbeat=False).acquire()
        proxy.hold_next_reply()
        assert client.release_owner("n", "claim:t1:0") is ReleaseResult.RELEASED
        assert proxy.holding.is_set()
        assert free(lock_client, "lease")
        assert client.release_owner("n", "claim:t1:1") is ReleaseResult.NOT_HELD
    finally:
        client.close()


# -- the fair queue of a lease ------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_fair_wait_whose_unanswered_withdrawal_found_the_lease_handed_over_holds_nothing(
    lock_client: LockClient, proxy: HoldingProxy, side: str
) -> None:
    """The wait runs out; a release hands the lease to the waiter, still queued, just before
    its withdrawal (fair_abandon.lua) runs, and the withdrawal's reply, which says the lease
    is the waiter's, is lost. The acquire raises LockBackendError with the lease given back,
    not False with the name held, unrenewed, for the waiter's ttl."""
    holder = lock_client.lease("n", ttl=30, heartbeat=False)
    assert holder.acquire()
    withdrawal = lock_client.connection.scripts.fair_abandon_call(holder.keys.lock, "")[0]
    helpers: list[threading.Thread] = []

    def hand_over_before_the_withdrawal() -> None:
        assert proxy.stopped.wait(10), "the withdrawal did not come"
        holder.release()  # the waiter is still queued: the lease is handed to it
        proxy.let_through()

    async def body(client: Side) -> None:
        # The scripts loaded: a fair wait that runs out, withdrawn.
        assert not await make(client, "lease", fair=True).acquire(0.1)
        waiter = make(client, "lease", fair=True)
        proxy.stop_next_call(withdrawal.sha.encode())
        helpers.append(threading.Thread(target=hand_over_before_the_withdrawal, daemon=True))
        helpers[0].start()
        with pytest.raises(LockBackendError):
            await waiter.acquire(0.3)
        assert not waiter.held

    through_proxy(lock_client, proxy, side, body, retries=0)
    helpers[0].join(10)
    assert proxy.holding.is_set()  # the withdrawal ran, and its reply was lost
    assert free(lock_client, "lease")  # given back, not left to run out in 30 s
    assert lock_client.redis.llen(holder.keys.base + b"queue") == 0
