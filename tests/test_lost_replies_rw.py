"""The reader-writer lock's operations whose reply is lost: sent again, or raised.

As test_lost_replies.py, through the public API only: the acquire of each mode, the upgrade
and the downgrade, each with its reply held back once (support/proxies.py) and
then sent again by redis-py (``retries=1``) or raised (``retries=0``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.lost_replies import fence, proxied_client
from support.proxies import HoldingProxy

from celery_singleton_lock import LockBackendError, LockClient

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
        proxy.hold_next_reply()
        with pytest.raises(LockBackendError):
            handle.acquire()
        assert proxy.holding.is_set()
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
        proxy.hold_next_reply()
        with pytest.raises(LockBackendError):
            handle.upgrade(0)
        assert proxy.holding.is_set()
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
        proxy.hold_next_reply()
        with pytest.raises(LockBackendError):
            handle.downgrade()
        assert proxy.holding.is_set()
        assert handle.held and not handle.lost
        handle.downgrade()  # the caller's retry
        assert not handle.upgraded
        assert reader_free(lock_client)
        handle.release()
        assert writer_free(lock_client)
    finally:
        client.close()
