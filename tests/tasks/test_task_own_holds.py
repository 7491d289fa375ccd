"""A run that finds its lock held under its own task id, on a real in-process worker whose
lock Redis sits behind a proxy that loses a reply or goes down for a moment (the broker and
the result backend are on the real server): the orphaned hold of an earlier attempt is taken
over, not mistaken for a live original."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
import redis
from celery import Celery
from support.proxies import OutageProxy

from celery_singleton_lock import LockBackendError, SingletonTask
from celery_singleton_lock.core.holder import flatten
from celery_singleton_lock.core.keys import lock_keys

WorkerFactory = Callable[..., AbstractContextManager[Any]]

TIMEOUT = 30.0


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def proxy(lock_redis_url: str) -> Iterator[OutageProxy]:
    port = int(redis.Redis.from_url(lock_redis_url).connection_pool.connection_kwargs["port"])
    proxied = OutageProxy(port)
    yield proxied
    proxied.close()


@pytest.fixture
def server(lock_redis_url: str) -> Iterator[redis.Redis]:
    """The lock Redis itself, not through the proxy."""
    client = redis.Redis.from_url(lock_redis_url, decode_responses=True)
    yield client
    client.close()


def retrying_task(app: Celery, proxy: OutageProxy, **options: Any) -> Any:
    """The documented autoretry of a lock Redis that did not answer, with the app's locks
    behind ``proxy`` and a socket timeout of a second."""
    app.conf.update(
        singleton_lock_url=proxy.url, singleton_lock_client_kwargs={"socket_timeout": 1.0}
    )

    @app.task(
        base=SingletonTask, bind=True, shared=False, lock_key="job:{key}", lock_lease=60,
        autoretry_for=(LockBackendError,), retry_backoff=True, max_retries=None, **options,
    )  # fmt: skip
    def job(self: Any, key: str) -> dict[str, Any]:
        return {"retries": self.request.retries, "token": self.lock.token}

    return job


def holder(server: redis.Redis, prefix: str, name: str) -> dict[str, str]:
    """The holder fields of lock ``name``, as text: read as bytes (a lease keeps its holder
    fields packed in one binary field), then unpacked."""
    raw = redis.Redis(connection_pool=redis.ConnectionPool(
        **{**server.connection_pool.connection_kwargs, "decode_responses": False}
    ))  # fmt: skip
    try:
        fields = flatten(raw.hgetall(lock_keys(prefix, name).lock))
    finally:
        raw.close()
    return {key.decode(): value.decode() for key, value in fields.items()}


def test_lost_acquire_reply_leaves_a_hold_the_autoretry_takes_over(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    proxy: OutageProxy,
    server: redis.Redis,
    lock_prefix: str,
) -> None:
    job = retrying_task(celery_lock_app, proxy)
    with in_process_worker(celery_lock_app, concurrency=1):
        assert job.delay("warm").get(timeout=TIMEOUT)["retries"] == 0  # connected, scripts in
        proxy.lose_next_reply()
        result = job.delay("report")
        # The acquire script ran and took the lock; its reply never came (socket timeout),
        # and Redis stayed unreachable, so nothing could undo it: attempt 0's hold is left.
        assert proxy.lost.wait(TIMEOUT)
        wait_until(lambda: result.state == "RETRY", "the run to be retried")
        orphan = holder(server, lock_prefix, "job:report")
        assert orphan["task_id"] == result.id and orphan["attempt"] == "0", orphan
        proxy.up()
        outcome = result.get(timeout=TIMEOUT)
    assert outcome["retries"] >= 1 and outcome["token"] > int(orphan["token"]), outcome
    assert not holder(server, lock_prefix, "job:report")  # released at the end of the run


def test_enqueue_claim_stranded_by_a_blip_is_taken_over_and_does_not_block_the_key(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    proxy: OutageProxy,
    server: redis.Redis,
    lock_prefix: str,
) -> None:
    job = retrying_task(celery_lock_app, proxy, lock_on_enqueue=True)
    result = job.delay("sync")  # claims the key for attempt 0 at enqueue
    assert holder(server, lock_prefix, "job:sync")["owner"] == f"claim:{result.id}:0"
    proxy.down()  # unreachable when attempt 0 starts: it never takes its claim over
    with in_process_worker(celery_lock_app, concurrency=1):
        wait_until(lambda: result.state == "RETRY", "the run to be retried")
        assert holder(server, lock_prefix, "job:sync")["owner"] == f"claim:{result.id}:0"
        proxy.up()
        assert result.get(timeout=TIMEOUT)["retries"] >= 1
        # The key is not left deduplicated to a call that is over.
        again = job.delay("sync")
        assert again.id != result.id
        assert again.get(timeout=TIMEOUT)["retries"] == 0


@pytest.mark.parametrize("on_enqueue", ["until_start", "debounce"])
def test_queue_claim_stranded_by_a_blip_is_freed_by_the_retry(
    celery_lock_app: Celery,
    in_process_worker: WorkerFactory,
    proxy: OutageProxy,
    server: redis.Redis,
    lock_prefix: str,
    on_enqueue: str,
) -> None:
    """Attempt 0 could not free its queue claim (the lock Redis did not answer as it
    started); its retry frees it, so the next call of the key is queued, not deduplicated
    to a call that already ran."""
    job = retrying_task(celery_lock_app, proxy, lock_on_enqueue=on_enqueue)
    result = job.delay("sync")
    assert holder(server, lock_prefix, "job:sync#queued")["owner"] == f"claim:{result.id}:0"
    proxy.down()
    with in_process_worker(celery_lock_app, concurrency=1):
        wait_until(lambda: result.state == "RETRY", "the run to be retried")
        proxy.up()
        assert result.get(timeout=TIMEOUT)["retries"] >= 1
        assert not holder(server, lock_prefix, "job:sync#queued")
        again = job.delay("sync")
        assert again.id != result.id
        assert again.get(timeout=TIMEOUT)["retries"] == 0
