"""An acquire whose reply is lost: sent again by redis-py's retry, or raised to the caller.

A proxy in front of the tests' Redis keeps the reply of one script call from the client
(support/proxies.py): the script ran, and the client's read runs into its socket timeout.
With a retry policy redis-py sends the same call again, with the same owner token: every
kind's acquire script answers its own owner as taken, with the token it already has. With
none the acquire raises LockBackendError, and what the lost attempt took is given back; a
claim (a fixed owner token) the attempt took over, or held already, stays as it was.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from support import lost_replies
from support.lost_replies import fence, proxied_client
from support.proxies import HoldingProxy

from celery_singleton_lock import (
    AsyncLockClient,
    HolderRecord,
    LockBackendError,
    LockClient,
    LockLost,
)
from celery_singleton_lock.core.keys import lock_keys

#: Makers of a handle of each kind on "n" (the multi-key lock also holds "n2").
KINDS: dict[str, Callable[[Any], Any]] = {
    "lease": lambda c: c.lease("n", ttl=30),
    "write": lambda c: c.rwlock("n").write(ttl=30),
    "range": lambda c: c.range_lock("n").write(0, 10, ttl=30),
    "multi": lambda c: c.multi(["n", "n2"], ttl=30),
}


async def async_proxied_client(
    lock_client: LockClient, proxy: HoldingProxy, kind: str, *, retries: int
) -> AsyncLockClient:
    """An asyncio client through ``proxy``, warmed up for ``kind`` as :func:`warm_up` does."""
    client = lost_replies.async_proxied_client(lock_client, proxy, retries)
    warm = KINDS[kind](client)
    assert await warm.acquire()
    await warm.release()
    return client


def warm_up(client: LockClient, kind: str) -> None:
    """A connection open and the kind's scripts loaded: the next reply is the attempt's."""
    handle = client.lease("warm-up") if kind == "claimed" else KINDS[kind](client)
    assert handle.acquire()
    handle.release()


def free(lock_client: LockClient, kind: str) -> bool:
    """Whether a stranger of the same kind takes the name(s) at once (and gives them back)."""
    handle = KINDS[kind](lock_client)
    taken = bool(handle.acquire(0))
    if taken:
        handle.release()
    return taken


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_acquire_sent_again_after_its_reply_was_lost_holds_with_its_token(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm_up(client, kind)
        handle = KINDS[kind](client)
        proxy.hold_next_reply()
        assert handle.acquire()  # the first run's reply held back; the retry's answered
        assert proxy.holding.is_set()
        assert handle.held
        # The token the first run handed out: the retry took no second one.
        assert handle.token == fence(lock_client, "n")
        if kind == "multi":
            assert handle.tokens == {"n": fence(lock_client, "n"), "n2": fence(lock_client, "n2")}
        assert not free(lock_client, kind)
        handle.release()
        assert free(lock_client, kind)
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_acquire_that_raised_with_its_reply_lost_leaves_the_name_free(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm_up(client, kind)
        handle = KINDS[kind](client)
        proxy.hold_next_reply()
        with pytest.raises(LockBackendError):
            handle.acquire()
        assert proxy.holding.is_set()  # the script ran
        assert not handle.held
        assert free(lock_client, kind)  # undone, not left to run out in 30 s
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fair", [False, True], ids=["pubsub", "fair"])
def test_an_acquire_that_would_wait_and_raised_with_its_reply_lost_leaves_the_name_free(
    lock_client: LockClient, proxy: HoldingProxy, fair: bool
) -> None:
    """Its first attempt (marking the name for a release to wake it, or queueing) took the
    free name, and its reply was lost."""
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm_up(client, "lease")
        waiter = client.lease("n", ttl=30, fair=fair)
        proxy.hold_next_reply()
        with pytest.raises(LockBackendError):
            waiter.acquire(wait=10)
        assert proxy.holding.is_set()
        assert not waiter.held
        assert free(lock_client, "lease")
        assert not lock_client.redis.exists(lock_keys(lock_client.prefix, "n").base + b"queue")
    finally:
        client.close()


def claim(lock_client: LockClient, owner: str, task_id: str) -> None:
    lease = lock_client.lease(
        "n", ttl=60, heartbeat=False, owner=owner, owner_info={"task_id": task_id}
    )
    assert lease.acquire()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fixed_owner", [None, "claim:t2:0"], ids=["run", "debounce"])
def test_a_failed_take_over_puts_the_claim_back(
    lock_client: LockClient, proxy: HoldingProxy, fixed_owner: str | None
) -> None:
    """A run taking over its message's claim, or a new call's claim taking over a queued
    one's: the take-over ran and its reply was lost. The undo must not free the claim."""
    claim(lock_client, "claim:t1:0", "t1")
    pttl = lock_client.redis.pttl(lock_keys(lock_client.prefix, "n").lock)
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm_up(client, "claimed")
        run = client.lease("n", ttl=30, owner=fixed_owner, take_over="claim:t1:0")
        proxy.hold_next_reply()
        with pytest.raises(LockBackendError):
            run.acquire()
        assert not run.held
        assert lock_client.holders("n") == [HolderRecord(owner="claim:t1:0", task_id="t1")]
        left = lock_client.redis.pttl(lock_keys(lock_client.prefix, "n").lock)
        assert 30_000 < left <= pttl  # its own expiry, not the run's ttl
        # Still the claim of the queued message: its own run takes it over.
        assert lock_client.lease("n", take_over="claim:t1:0").acquire()
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_failed_acquire_under_a_claim_token_holding_already_leaves_the_claim(
    lock_client: LockClient, proxy: HoldingProxy
) -> None:
    claim(lock_client, "claim:t1:0", "t1")
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm_up(client, "claimed")
        again = client.lease("n", ttl=30, heartbeat=False, owner="claim:t1:0")
        proxy.hold_next_reply()
        with pytest.raises(LockBackendError):
            again.acquire()
        assert lock_client.holders("n") == [HolderRecord(owner="claim:t1:0", task_id="t1")]
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_fixed_owner_acquire_sent_again_holds_and_its_undo_frees_only_its_own(
    lock_client: LockClient, proxy: HoldingProxy
) -> None:
    """A claim taken by this very call (the name was free) is this call's to give back."""
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm_up(client, "lease")
        mine = client.lease("n", ttl=30, heartbeat=False, owner="claim:t1:0")
        proxy.hold_next_reply()
        assert mine.acquire()
        assert mine.token == fence(lock_client, "n")
        mine.release()
    finally:
        client.close()
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm_up(client, "lease")
        mine = client.lease("n", ttl=30, heartbeat=False, owner="claim:t1:0")
        proxy.hold_next_reply()
        with pytest.raises(LockBackendError):
            mine.acquire()
        assert lock_client.holders("n") == []
    finally:
        client.close()


# -- asyncio ---------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_async_acquire_sent_again_after_its_reply_was_lost_holds_with_its_token(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    async def body() -> None:
        client = await async_proxied_client(lock_client, proxy, kind, retries=1)
        try:
            handle = KINDS[kind](client)
            proxy.hold_next_reply()
            assert await handle.acquire()
            assert proxy.holding.is_set()
            assert handle.token == fence(lock_client, "n")
            assert not free(lock_client, kind)
            await handle.release()
            assert free(lock_client, kind)
        finally:
            await client.close()

    asyncio.run(body())


# -- a release sent again ----------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["lease", "multi", "write"])
def test_a_delayed_release_sent_again_after_its_reply_was_lost_is_a_release(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm_up(client, kind)
        handle = KINDS[kind](client)
        assert handle.acquire()
        proxy.hold_next_reply()
        handle.release(delay=60)  # the first run's reply held back; the retry's answered
        assert proxy.holding.is_set()
        assert not handle.held and not handle.lost
        assert not free(lock_client, kind)  # in its release delay
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["lease", "multi"])
def test_a_release_sent_again_after_its_reply_was_lost_says_the_first_may_have_freed_it(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    """The release ran, its reply was lost (LockBackendError: the handle keeps its owner
    token for a retry, as documented); a stranger took and released the name; then the
    caller sends it again, which finds nothing of its own, nor its trace (the stranger's
    release replaced it). Nothing in Redis tells that apart from a lease lost before the
    first release arrived, so it still raises, fail closed, but says that the first one may
    have freed it. (With nothing in between, see test_lost_replies.py; the holds of
    reader-writer and range locks keep their trace in their own hash, see below.)"""
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm_up(client, kind)
        handle = KINDS[kind](client)
        assert handle.acquire()
        proxy.hold_next_reply()
        with pytest.raises(LockBackendError):
            handle.release()
        assert proxy.holding.is_set()
        assert free(lock_client, kind)  # the first release did run
        with pytest.raises(LockLost, match="earlier release of it whose reply was lost"):
            handle.release()
        assert not handle.held
        # An answered release after that is plain again.
        assert handle.acquire()
        handle.release()
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["write", "range"])
def test_a_hold_release_sent_again_after_a_strangers_release_is_a_release(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    """As above, but the hold of a reader-writer or range lock left the trace of its release
    in its own hash, which the stranger's release does not touch: released."""
    client = proxied_client(lock_client, proxy, retries=0)
    try:
        warm_up(client, kind)
        handle = KINDS[kind](client)
        assert handle.acquire()
        proxy.hold_next_reply()
        with pytest.raises(LockBackendError):
            handle.release()
        assert proxy.holding.is_set()
        assert free(lock_client, kind)  # the first release did run
        handle.release()
        assert not handle.held and not handle.lost
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_async_acquire_that_raised_with_its_reply_lost_leaves_the_name_free(
    lock_client: LockClient, proxy: HoldingProxy, kind: str
) -> None:
    async def body() -> None:
        client = await async_proxied_client(lock_client, proxy, kind, retries=0)
        try:
            handle = KINDS[kind](client)
            proxy.hold_next_reply()
            with pytest.raises(LockBackendError):
                await handle.acquire()
            assert proxy.holding.is_set()
            assert not handle.held
            assert free(lock_client, kind)
        finally:
            await client.close()

    asyncio.run(body())


@pytest.mark.timeout(60)
def test_a_hand_over_sent_again_after_its_reply_was_lost_is_a_hand_over(
    lock_client: LockClient, proxy: HoldingProxy
) -> None:
    client = proxied_client(lock_client, proxy, retries=1)
    try:
        warm = client.lease("warm-up")
        assert warm.acquire()
        warm.hand_over("claim:w:1", ttl=1)  # the script loaded
        lease = client.lease("n", ttl=30, owner_info={"task_id": "t1"})
        assert lease.acquire()
        proxy.hold_next_reply()
        lease.hand_over("claim:t1:1", ttl=60, owner_info={"task_id": "t1"})
        assert proxy.holding.is_set()
        assert not lease.held
        assert lock_client.holders("n") == [HolderRecord(owner="claim:t1:1", task_id="t1")]
    finally:
        client.close()
