"""A connection cut in the middle of a multi-key acquire never leaves a subset of the names
held. A Redis script is atomic, so a cut either loses the reply (the script ran: every name is
held, by the owner of the acquire that raised, which gives them back) or the request (nothing
is held). A small TCP proxy between client and Redis makes both cuts
(support/proxies.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from support.proxies import CuttingProxy

from celery_singleton_lock import LockBackendError, LockClient
from celery_singleton_lock.core.keys import lock_keys
from celery_singleton_lock.embedded import RedisServer

NAMES = ["acct:1", "acct:2", "acct:3"]


@pytest.fixture
def setup(restartable_redis: RedisServer) -> Iterator[tuple[CuttingProxy, LockClient, redis.Redis]]:
    proxy = CuttingProxy(restartable_redis.port)
    via = redis.Redis(port=proxy.port, retry=Retry(NoBackoff(), 0), socket_timeout=5)
    client = LockClient(via, prefix="cut:")
    direct = redis.Redis(port=restartable_redis.port)
    yield proxy, client, direct
    client.close()
    direct.close()
    proxy.listener.close()


def holders(direct: redis.Redis) -> list[bytes | None]:
    return [direct.hget(lock_keys("cut:", name).lock, "owner") for name in NAMES]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["reply", "request"])
def test_a_cut_multi_acquire_holds_all_names_or_none_and_everything_expires(
    setup: tuple[CuttingProxy, LockClient, redis.Redis], mode: str
) -> None:
    proxy, client, direct = setup
    multi = client.multi(NAMES, ttl=1.5, heartbeat=False)
    assert multi.acquire()  # connected through the proxy, the script loaded (no NOSCRIPT)
    multi.release()
    proxy.arm(mode)
    with pytest.raises(LockBackendError):
        multi.acquire()
    assert proxy.cut.wait(5)
    # "reply": the script ran, every name held by an owner the client never heard of; the
    # failed acquire gave them back. "request": nothing ran. Either way nothing is held.
    assert holders(direct) == [None] * len(NAMES)
    assert not multi.held
    # Never a subset; afterwards the names are free for anyone, through the same client.
    again = client.multi(NAMES, ttl=5, heartbeat=False)
    assert again.acquire()
    assert len(set(holders(direct))) == 1 and holders(direct)[0] is not None
    again.release()
    assert holders(direct) == [None] * len(NAMES)
