"""The reader-writer lock's operations whose reply is lost: sent again, or raised.

As test_lost_replies.py, through the public API only: the acquire of each mode, the release,
the upgrade and the downgrade, each with its reply held back once (support/proxies.py) and
then sent again by redis-py (``retries=1``) or raised (``retries=0``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import pytest
from support.lost_replies import async_proxied_client, fence, proxied_client, reply_lost
from support.proxies import HoldingProxy
from support.waiting import wait_for

from celery_singleton_lock import LockBackendError, LockClient, LockExpired
from celery_singleton_lock.kinds import rangelock, rwlock, semaphore

MODES: dict[str, Callable[[Any], Any]] = {
    "read": lambda c: c.rwlock("n").read(ttl=30, heartbeat=False),
    "upgradable": lambda c: c.rwlock("n").upgradable(ttl=30, heartbeat=False),
    "write": lambda c: c.rwlock("n").write(ttl=30, heartbeat=False),
}


def writer_free(lock_client: LockClient) -> bool:
    """Whether a writer takes "n" at once (and gives it back): nothing holds it."""
    writer = lock_client.rwlock("n").write(heartbeat=False)
    taken = bool(writer.acquire(0))
    if taken:
        writer.release()
    return taken


def reader_free(lock_client: LockClient) -> bool:
    """Whether a reader gets in at once (and goes): no writer holds it."""
    reader = lock_client.rwlock("n").read(heartbeat=False)
    taken = bool(reader.acquire(0))
    if taken:
        reader.release()
    return taken


def holds(lock_client: LockClient) -> int:
    return len([info for info in lock_client.locks("n") if info.owner])


def warm(client: LockClient, mode: str, *, upgrade: bool = False) -> None:
    """Run once what the test then loses a reply of: connection open, scripts loaded."""
    handle = MODES[mode](client)
    assert handle.acquire()
    if upgrade:
        assert handle.upgrade(0)
        handle.downgrade()
    handle.release()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", list(MODES))
def test_an_acquire_sent_again_holds_with_its_token(
    lock_client: LockClient, proxy: HoldingProxy, mode: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm(client, mode)
        handle = MODES[mode](client)
        proxy.hold_next_reply()
        assert handle.acquire()
        assert proxy.holding.is_set()
        assert handle.held and handle.token == fence(lock_client, "n")
        assert holds(lock_client) == 1
        assert not writer_free(lock_client)
        handle.release()
        assert writer_free(lock_client)
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", list(MODES))
def test_an_acquire_that_raised_leaves_the_name_free(
    lock_client: LockClient, proxy: HoldingProxy, mode: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm(client, mode)
        handle = MODES[mode](client)
        with reply_lost(proxy):
            handle.acquire()
        assert not handle.held
        assert holds(lock_client) == 0
        assert writer_free(lock_client)
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_an_upgrade_sent_again_is_one_upgrade(lock_client: LockClient, proxy: HoldingProxy) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm(client, "upgradable", upgrade=True)
        handle = MODES["upgradable"](client)
        assert handle.acquire()
        proxy.hold_next_reply()
        assert handle.upgrade(0)
        assert proxy.holding.is_set()
        assert handle.upgraded and handle.held
        assert not reader_free(lock_client)  # the writer now
        handle.downgrade()
        assert reader_free(lock_client)
        handle.release()
        assert writer_free(lock_client)
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_an_upgrade_that_raised_can_be_sent_again_by_the_caller(
    lock_client: LockClient, proxy: HoldingProxy
) -> None:
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm(client, "upgradable", upgrade=True)
        handle = MODES["upgradable"](client)
        assert handle.acquire()
        with reply_lost(proxy):
            handle.upgrade(0)
        assert handle.held and not handle.lost
        assert handle.upgrade(0)  # the caller's retry
        assert handle.upgraded
        assert not reader_free(lock_client)
        handle.downgrade()
        assert reader_free(lock_client)
        handle.release()
        assert writer_free(lock_client)
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_downgrade_sent_again_is_one_downgrade(
    lock_client: LockClient, proxy: HoldingProxy
) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm(client, "upgradable", upgrade=True)
        handle = MODES["upgradable"](client)
        assert handle.acquire()
        assert handle.upgrade(0)
        proxy.hold_next_reply()
        handle.downgrade()
        assert proxy.holding.is_set()
        assert not handle.upgraded and handle.held
        assert reader_free(lock_client)
        assert not writer_free(lock_client)
        handle.release()
        assert writer_free(lock_client)
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_downgrade_that_raised_can_be_sent_again_by_the_caller(
    lock_client: LockClient, proxy: HoldingProxy
) -> None:
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm(client, "upgradable", upgrade=True)
        handle = MODES["upgradable"](client)
        assert handle.acquire()
        assert handle.upgrade(0)
        with reply_lost(proxy):
            handle.downgrade()
        assert handle.held and not handle.lost
        handle.downgrade()  # the caller's retry
        assert not handle.upgraded
        assert reader_free(lock_client)
        handle.release()
        assert writer_free(lock_client)
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_an_upgrade_after_a_downgrade_that_raised_asks_redis(
    lock_client: LockClient, proxy: HoldingProxy
) -> None:
    """The downgrade ran and its reply was lost: the hold is upgradable again, readers come
    in. The handle cannot tell that from a downgrade that never arrived, so it no longer
    takes itself for the writer: an upgrade asks Redis again (it used to answer True at
    once, a writer beside readers)."""
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm(client, "upgradable", upgrade=True)
        handle = MODES["upgradable"](client)
        assert handle.acquire()
        assert handle.upgrade(0)
        with reply_lost(proxy):
            handle.downgrade()
        reader = lock_client.rwlock("n").read(heartbeat=False)
        assert reader.acquire(0)  # the downgrade did run
        assert not handle.upgrade(0)  # a reader holds: no writer beside it
        assert not handle.upgraded and handle.held
        reader.release()
        assert handle.upgrade(0)
        assert not reader_free(lock_client)
        handle.release()
        assert writer_free(lock_client)
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("change", ["upgrade", "downgrade"])
def test_a_release_after_a_change_that_raised_frees_the_hold_as_it_is(
    lock_client: LockClient, proxy: HoldingProxy, change: str
) -> None:
    """The change ran and its reply was lost; the context is left as its error goes by.
    The release frees the hold in the mode Redis has it in, not the one the handle last
    heard of: a downgraded hold released as the writer used to keep its upgradable slot,
    blocking upgradables and writers until its lease ran out."""
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm(client, "upgradable", upgrade=True)
        handle = MODES["upgradable"](client)
        with pytest.raises(LockBackendError), handle:
            if change == "downgrade":
                assert handle.upgrade(0)
            proxy.hold_next_reply()
            getattr(handle, change)()
        assert proxy.holding.is_set()
        assert not handle.held and not handle.lost
        assert holds(lock_client) == 0
        assert writer_free(lock_client)
        other = lock_client.rwlock("n").upgradable(heartbeat=False)
        assert other.acquire(0)
        other.release()
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_an_async_downgrade_cancelled_after_it_ran_leaves_the_mode_unknown(
    lock_client: LockClient, proxy: HoldingProxy
) -> None:
    """asyncio: the downgrade ran and the task was cancelled while its reply was awaited.
    As after LockBackendError, the handle no longer takes itself for the writer, and its
    release frees the hold as Redis has it."""

    async def body() -> None:
        # The reply held back is ended by the cancel, not by a timeout: a long one, so that
        # a loaded machine's slow thread hand-over is not taken for one.
        client = async_proxied_client(lock_client, proxy, retries=0, socket_timeout=10)
        try:
            warm_up = client.rwlock("n").upgradable(ttl=30, heartbeat=False)
            assert await warm_up.acquire()
            assert await warm_up.upgrade(0)
            await warm_up.downgrade()
            await warm_up.release()
            handle = client.rwlock("n").upgradable(ttl=30, heartbeat=False)
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
            await client.redis.connection_pool.disconnect()
            reader = lock_client.rwlock("n").read(heartbeat=False)
            assert reader.acquire(0)
            assert not await handle.upgrade(0)  # a reader holds: no writer beside it
            assert not handle.upgraded
            reader.release()
            await handle.release()
            assert writer_free(lock_client)
        finally:
            await client.close()

    asyncio.run(body())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", list(MODES))
def test_a_release_sent_again_is_one_release(
    lock_client: LockClient, proxy: HoldingProxy, mode: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm(client, mode)
        handle = MODES[mode](client)
        assert handle.acquire()
        proxy.hold_next_reply()
        handle.release()  # the retry finds it released by the first run: not an error
        assert proxy.holding.is_set()
        assert not handle.held and not handle.lost
        assert writer_free(lock_client)
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", list(MODES))
def test_a_release_that_raised_then_sent_by_the_caller_is_a_release(
    lock_client: LockClient, proxy: HoldingProxy, mode: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm(client, mode)
        handle = MODES[mode](client)
        assert handle.acquire()
        with reply_lost(proxy):
            handle.release()
        handle.release()  # the caller's retry, with nothing in between
        assert not handle.held and not handle.lost
        assert writer_free(lock_client)
    finally:
        client.close()


# -- the other holds of the interval engine (semaphore, range lock) ----------------------------

OTHER_HOLDS: dict[str, Callable[[Any], Any]] = {
    "semaphore": lambda c: c.semaphore("n", 1).permit(ttl=30, heartbeat=False),
    "range": lambda c: c.range_lock("n").write(0, 10, ttl=30, heartbeat=False),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(OTHER_HOLDS))
def test_an_interval_release_sent_again_is_one_release(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm_up = OTHER_HOLDS[kind](client)
        assert warm_up.acquire()
        warm_up.release()
        handle = OTHER_HOLDS[kind](client)
        assert handle.acquire()
        proxy.hold_next_reply()
        handle.release()  # the retry finds it released by the first run: not an error
        assert proxy.holding.is_set()
        assert not handle.held and not handle.lost
        stranger = OTHER_HOLDS[kind](lock_client)
        assert stranger.acquire(0)
        stranger.release()
    finally:
        client.close()


# -- what the trace of a release does not answer --------------------------------------------

ALL_HOLDS: dict[str, Callable[[Any], Any]] = {**MODES, **OTHER_HOLDS}
#: The same holds with a lease of 1 s.
SHORT_HOLDS: dict[str, Callable[[Any], Any]] = {
    "read": lambda c: c.rwlock("n").read(ttl=1, heartbeat=False),
    "upgradable": lambda c: c.rwlock("n").upgradable(ttl=1, heartbeat=False),
    "write": lambda c: c.rwlock("n").write(ttl=1, heartbeat=False),
    "semaphore": lambda c: c.semaphore("n", 1).permit(ttl=1, heartbeat=False),
    "range": lambda c: c.range_lock("n").write(0, 10, ttl=1, heartbeat=False),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(ALL_HOLDS))
def test_a_release_sent_again_after_the_hold_ran_out_raises(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    # The trace of a release lasts what the hold had left: a release sent again once that is
    # over cannot tell its first run from an expiry, and says so (fail closed).
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm_up = ALL_HOLDS[kind](client)
        assert warm_up.acquire()
        warm_up.release()
        handle = SHORT_HOLDS[kind](client)
        assert handle.acquire()
        trace = handle.keys.holder(handle.owner)
        with reply_lost(proxy):
            handle.release()
        assert lock_client.redis.hget(trace, "state") == b"released"
        assert holds(lock_client) == 0  # a trace is not listed as a hold
        wait_for(lambda: not lock_client.redis.exists(trace), 10, "the trace to run out")
        with pytest.raises(LockExpired, match="earlier release"):
            handle.release()
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(ALL_HOLDS))
def test_a_hold_cleared_leaves_no_trace_its_release_could_take_for_its_own(
    lock_client: LockClient, kind: str
) -> None:
    handle = ALL_HOLDS[kind](lock_client)
    assert handle.acquire()
    assert lock_client.clear("n", token=handle.token, force=True)
    # The clear's own trace, for the clear sent again: not a hold, nor a release of its.
    assert lock_client.redis.hget(handle.keys.holder(handle.owner), "cleared") == b"1"
    assert holds(lock_client) == 0
    with pytest.raises(LockExpired):
        handle.release()


# -- the admin side, and release delays ------------------------------------------------------

#: Makers of a hold of each kind on "n", with the handle's options.
HOLDS: dict[str, Callable[..., Any]] = {
    "read": lambda c, **o: c.rwlock("n").read(ttl=30, heartbeat=False, **o),
    "upgradable": lambda c, **o: c.rwlock("n").upgradable(ttl=30, heartbeat=False, **o),
    "write": lambda c, **o: c.rwlock("n").write(ttl=30, heartbeat=False, **o),
    "semaphore": lambda c, **o: c.semaphore("n", 1).permit(ttl=30, heartbeat=False, **o),
    "range": lambda c, **o: c.range_lock("n").write(0, 10, ttl=30, heartbeat=False, **o),
}
#: The supervisor's release of a dead task's holds of each kind.
RELEASE_HOLDER: dict[str, Callable[..., bool]] = {
    "read": rwlock.release_holder,
    "upgradable": rwlock.release_holder,
    "write": rwlock.release_holder,
    "semaphore": semaphore.release_holder,
    "range": rangelock.release_holder,
}
#: The admin's clear of one holder of each kind, by its owner.
CLEAR_HOLDER: dict[str, Callable[..., bool]] = {
    "read": rwlock.clear_holder,
    "upgradable": rwlock.clear_holder,
    "write": rwlock.clear_holder,
    "semaphore": semaphore.clear_holder,
    "range": rangelock.clear_holder,
}


def free(lock_client: LockClient, kind: str) -> bool:
    """Whether a stranger in the way of a hold of ``kind`` takes "n" at once (and goes)."""
    if kind in MODES:
        return writer_free(lock_client)
    stranger = HOLDS[kind](lock_client)
    taken = bool(stranger.acquire(0))
    if taken:
        stranger.release()
    return taken


def server_ms(lock_client: LockClient) -> int:
    seconds, micros = lock_client.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(HOLDS))
def test_a_clear_sent_again_says_it_cleared(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm_up = HOLDS[kind](lock_client)
        assert warm_up.acquire()
        assert client.clear("n", force=True)
        held = HOLDS[kind](lock_client)
        assert held.acquire()
        proxy.hold_next_script_reply()  # the listing's replies come through
        assert client.clear("n", force=True)
        assert proxy.holding.is_set()
        assert holds(lock_client) == 0 and free(lock_client, kind)
        # What the clear left for its own retry is no release of the holder's.
        with pytest.raises(LockExpired):
            held.release()
    finally:
        client.close()


@pytest.mark.parametrize("token", [False, True])
@pytest.mark.parametrize("kind", list(HOLDS))
def test_a_hold_cleared_by_its_owner_is_lost_to_its_holder(
    lock_client: LockClient, kind: str, token: bool
) -> None:
    held = HOLDS[kind](lock_client)
    assert held.acquire()
    fencing = held.token if token else None
    assert CLEAR_HOLDER[kind](lock_client, "n", held.owner, fencing)
    assert CLEAR_HOLDER[kind](lock_client, "n", held.owner, fencing)  # as if sent again
    assert holds(lock_client) == 0 and free(lock_client, kind)
    with pytest.raises(LockExpired):
        held.release()


@pytest.mark.parametrize("kind", list(HOLDS))
def test_a_clear_of_another_fencing_token_finds_a_cleared_hold_gone(
    lock_client: LockClient, kind: str
) -> None:
    held = HOLDS[kind](lock_client)
    assert held.acquire()
    assert CLEAR_HOLDER[kind](lock_client, "n", held.owner, held.token)
    # Only the clear that freed it is answered cleared again, as a lease's clear is.
    assert not CLEAR_HOLDER[kind](lock_client, "n", held.owner, held.token + 1)
    assert CLEAR_HOLDER[kind](lock_client, "n", held.owner, held.token)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("delay", [0, 60])
@pytest.mark.parametrize("kind", list(HOLDS))
def test_a_release_holder_sent_again_frees_it_once_and_says_so(
    lock_client: LockClient, proxy: HoldingProxy, kind: str, delay: int
) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    release_holder = RELEASE_HOLDER[kind]
    try:
        warm_up = HOLDS[kind](lock_client, owner_info={"task_id": "t0"})
        assert warm_up.acquire()
        assert release_holder(client, "n", task_id="t0", pid=os.getpid())
        held = HOLDS[kind](lock_client, owner_info={"task_id": "t1"})
        assert held.acquire()
        sent_ms = server_ms(lock_client)
        proxy.hold_next_script_reply()
        assert release_holder(client, "n", task_id="t1", pid=os.getpid(), delay=delay)
        assert proxy.holding.is_set()
        assert free(lock_client, kind) == (delay == 0)
        if delay:
            # The delay runs from the first run: the retry went only after the client's
            # socket timeout (0.5 s).
            trace = held.keys.holder(held.owner)
            assert int(lock_client.redis.hget(trace, "released_ms")) - sent_ms < 500
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("retry_delay", [60, 0])
@pytest.mark.parametrize("kind", list(HOLDS))
def test_a_delayed_release_sent_again_leaves_the_delay_where_it_was(
    lock_client: LockClient, proxy: HoldingProxy, kind: str, retry_delay: int
) -> None:
    # The caller's retry may come with the delay or without: either way the hold is in its
    # delay already, and a release delay holds whatever its holder calls afterwards.
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm_up = HOLDS[kind](client)
        assert warm_up.acquire()
        warm_up.release()
        handle = HOLDS[kind](client)
        assert handle.acquire()
        hold = handle.keys.holder(handle.owner)
        with reply_lost(proxy):
            handle.release(delay=60)
        redis = lock_client.redis
        released_ms, left_ms = redis.hget(hold, "released_ms"), redis.pttl(hold)
        assert released_ms is not None
        handle.release(delay=retry_delay)  # the caller's retry
        assert not handle.held and not handle.lost
        assert redis.hget(hold, "released_ms") == released_ms
        assert 0 < redis.pttl(hold) <= left_ms
        assert not free(lock_client, kind)
    finally:
        client.close()


# -- a hold with a call identity (the ``call`` option) -------------------------------------------

CALLED: dict[str, Callable[[Any], Any]] = {
    "read": lambda c: c.rwlock("n").read(ttl=30, heartbeat=False, call="call-1"),
    "semaphore": lambda c: c.semaphore("n", 2).permit(ttl=30, heartbeat=False, call="call-1"),
    "range": lambda c: c.range_lock("n").read(0, 10, ttl=30, heartbeat=False, call="call-1"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(CALLED))
def test_an_acquire_with_a_call_sent_again_is_not_refused_by_its_own_hold(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm_up = CALLED[kind](client)
        assert warm_up.acquire()
        warm_up.release()
        handle = CALLED[kind](client)
        proxy.hold_next_reply()
        # The first send took the hold under the call; the second is that attempt again,
        # answered with its token, not refused as another delivery of the call.
        assert handle.acquire()
        assert proxy.holding.is_set()
        assert handle.held and not handle.held_by_call
        assert handle.token == fence(lock_client, "n")
        copy = CALLED[kind](lock_client)
        assert not copy.acquire() and copy.held_by_call
        handle.release()
    finally:
        client.close()
