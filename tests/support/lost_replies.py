"""Clients whose next reply can be lost: a :class:`HoldingProxy` in front of the tests'
Redis (``proxy`` fixture, loaded by the tests' conftest) and lock clients through it, whose
redis-py either sends a call again when its reply does not come (``retries=1``) or raises
(``retries=0``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_singleton_lock import AsyncLockClient, LockBackendError, LockClient
from celery_singleton_lock.core.keys import lock_keys

from .proxies import HoldingProxy


@pytest.fixture
def proxy(lock_client: LockClient) -> Iterator[HoldingProxy]:
    proxied = HoldingProxy(int(lock_client.redis.connection_pool.connection_kwargs["port"]))
    yield proxied
    proxied.close()


def proxied_client(lock_client: LockClient, proxy: HoldingProxy, retries: int) -> LockClient:
    """A client of ``lock_client``'s prefix through ``proxy``: a reply held back is sent
    again ``retries`` times, then raised (socket timeout 0.5 s)."""
    via = redis.Redis(port=proxy.port, socket_timeout=0.5, retry=Retry(NoBackoff(), retries))
    return LockClient(via, prefix=lock_client.prefix)


def async_proxied_client(
    lock_client: LockClient, proxy: HoldingProxy, retries: int, socket_timeout: float = 0.5
) -> AsyncLockClient:
    """The asyncio :func:`proxied_client`; ``socket_timeout``: how long a reply held back is
    waited for."""
    via = redis.asyncio.Redis(
        port=proxy.port, socket_timeout=socket_timeout, retry=AsyncRetry(NoBackoff(), retries)
    )
    return AsyncLockClient(via, prefix=lock_client.prefix)


def fence(lock_client: LockClient, name: str) -> int:
    """The last fencing token handed out on ``name``."""
    return int(lock_client.redis.get(lock_keys(lock_client.prefix, name).fence))


@contextmanager
def reply_lost(proxy: HoldingProxy) -> Iterator[None]:
    """The one call made in the block runs on the server and its reply is held back: with no
    retry it raises LockBackendError (asserted, as is that the reply was held)."""
    proxy.hold_next_reply()
    with pytest.raises(LockBackendError):
        yield
    assert proxy.holding.is_set()
