"""SingletonTask steps whose reply from the lock Redis is lost: the step ran on the server,
and the producer or the worker never heard (support/proxies.py holds the reply back). The lock
client through the proxy sends the call again (``retries=1``), and the step has the effect of
one; or it does not (``retries=0``), the step raises LockBackendError, and what it took is
given back. The rule for the lock operations themselves is in test_lost_replies.py."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import MaxRetriesExceededError
from support.lost_replies import proxied_client
from support.proxies import HoldingProxy

from celery_singleton_lock import (
    LockBackendError,
    LockClient,
    SingletonTask,
    is_skipped,
    lock_lost,
    lock_released,
)
from celery_singleton_lock.celery.app_client import use_lock_client
from celery_singleton_lock.celery.sends import SEND_HEADER

#: The send id of an original call, carried by its copy as every copy carries it: a message
#: with no send id and no mark of a delivery again is a new send (sends.unmarked_is_new).
ORIGINAL = {SEND_HEADER: "original"}


@pytest.mark.timeout(60)
def test_a_hand_over_to_a_retry_never_sent_whose_reply_was_lost_leaves_no_claim(
    celery_lock_app: Celery, lock_client: LockClient, proxy: HoldingProxy
) -> None:
    """``self.retry()`` hands the run's lock to the next attempt first, and that reply is
    lost; then no retry is sent (max retries reached). The hand-over did happen: its claim,
    for a retry that will never run, must go as it does when Redis answered, not block the
    key for the claim's countdown plus ``lock_ttl``."""
    client = proxied_client(lock_client, proxy, retries=0)
    use_lock_client(celery_lock_app, client)  # the app's client (app_client.py)
    warm = client.lease("warm-up", heartbeat=False)
    assert warm.acquire()
    warm.hand_over("claim:warm-up:1", ttl=1)  # the hand-over script loaded
    hand_over = client.connection.scripts.handover_call(b"", "", "", 1, [])[0]

    @celery_lock_app.task(
        base=SingletonTask, shared=False, bind=True, max_retries=0, lock_key="report:{day}"
    )
    def report(self: Any, day: str, lose_hand_over: bool) -> str:
        if lose_hand_over:
            proxy.stop_next_call(hand_over.sha.encode())  # the hand-over's reply, no other
            proxy.let_through()  # it runs at once; only its reply is held back
            raise self.retry(countdown=60)
        return day

    failed = report.apply(("d1", True))
    assert proxy.holding.is_set()  # the hand-over ran, its reply was lost
    assert isinstance(failed.result, MaxRetriesExceededError)
    assert lock_client.holders("report:d1") == []
    ran = report.apply(("d1", False))
    assert not is_skipped(ran.result) and ran.result == "d1"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("retries", [1, 0])
def test_a_release_whose_reply_was_lost_frees_the_lock_once_and_marks_the_call_done(
    celery_lock_app: Celery,
    lock_client: LockClient,
    proxy: HoldingProxy,
    retries: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The run's release (its done mark first, in the same call) ran and its reply was
    lost. Sent again (``retries=1``), it finds its own trace: released, not lost. Not sent
    again, the run logs a WARNING and goes on. Either way the lock is free, the call is
    marked done, and a copy of its message is dropped."""
    caplog.set_level(logging.INFO, logger="celery_singleton_lock.task")
    celery_lock_app.conf.singleton_lock_done_marks = "always"  # the copy below is by hand
    client = proxied_client(lock_client, proxy, retries=retries)
    use_lock_client(celery_lock_app, client)
    signals: list[str] = []

    def released(sender: Any, **_: Any) -> None:
        signals.append("released")

    def lost(sender: Any, **_: Any) -> None:
        signals.append("lost")

    # No outcome to wait for (apply() stores none): the mark alone drops the copy.
    @celery_lock_app.task(
        base=SingletonTask, shared=False, lock_key="sync:{day}", ignore_result=True
    )
    def sync(day: str, lose_release: bool) -> str:
        if lose_release:
            proxy.hold_next_script_reply()  # the next script call is the run's release
        return day

    assert sync.apply(("warm-up", False)).result == "warm-up"  # the scripts loaded
    lock_released.connect(released, weak=False)
    lock_lost.connect(lost, weak=False)
    try:
        first = sync.apply(("d2", True), headers=ORIGINAL)
    finally:
        lock_released.disconnect(released)
        lock_lost.disconnect(lost)
    assert proxy.holding.is_set()
    assert first.result == "d2"
    assert lock_client.holders("sync:d2") == []
    if retries:
        assert signals == ["released"]
    else:
        assert signals == []
        assert "could not release 'sync:d2'" in caplog.text
    assert "without its lock" not in caplog.text
    copy = sync.apply(("d2", False), task_id=first.id, headers=ORIGINAL)
    assert copy.state == "IGNORED" and f"[{first.id}] dropped" in caplog.text


# -- the enqueue-time claim ---------------------------------------------------------------------


@pytest.fixture
def enqueued(celery_lock_app: Celery, lock_prefix: str) -> Callable[..., Any]:
    """A ``lock_on_enqueue`` task of ``celery_lock_app`` whose locks go through the client
    given (its scripts loaded), sending to a queue nobody consumes."""

    def task_through(client: LockClient, on_enqueue: bool | str = True) -> Any:
        warm_up = client.lease("warm-up", heartbeat=False, owner="claim:warm-up:0")
        assert warm_up.acquire()
        warm_up.release()
        use_lock_client(celery_lock_app, client)  # the app's client (app_client.py)
        celery_lock_app.conf.task_default_queue = f"{lock_prefix}unconsumed"

        @celery_lock_app.task(base=SingletonTask, shared=False, lock_on_enqueue=on_enqueue)
        def job(customer: int) -> int:
            return customer

        return job

    return task_through


def queued(lock_client: LockClient, lock_prefix: str) -> int:
    """How many messages wait in the unconsumed queue (the broker is the tests' Redis)."""
    return int(lock_client.redis.llen(f"{lock_prefix}unconsumed"))


def claims(lock_client: LockClient) -> list[str | None]:
    return [info.task_id for info in lock_client.locks() if info.owner]


@pytest.mark.timeout(60)
def test_an_enqueue_claim_sent_again_is_one_claim_and_one_message(
    lock_client: LockClient,
    proxy: HoldingProxy,
    enqueued: Callable[..., Any],
    lock_prefix: str,
) -> None:
    job = enqueued(proxied_client(lock_client, proxy, retries=1))
    proxy.hold_next_script_reply()
    sent = job.apply_async((5,))
    assert proxy.holding.is_set()
    assert queued(lock_client, lock_prefix) == 1
    assert claims(lock_client) == [sent.id]
    assert job.delay(5).id == sent.id  # deduplicated against it
    assert queued(lock_client, lock_prefix) == 1


@pytest.mark.timeout(60)
def test_an_enqueue_claim_that_raised_leaves_no_claim_and_no_message(
    lock_client: LockClient,
    proxy: HoldingProxy,
    enqueued: Callable[..., Any],
    lock_prefix: str,
) -> None:
    job = enqueued(proxied_client(lock_client, proxy, retries=0))
    proxy.hold_next_script_reply()
    with pytest.raises(LockBackendError):
        job.apply_async((5,))
    assert proxy.holding.is_set()  # the claim was taken, and its reply lost
    assert queued(lock_client, lock_prefix) == 0
    assert claims(lock_client) == []  # given back: the key is not blocked for lock_queue_ttl
    sent = job.apply_async((5,))  # the producer's own retry goes through
    assert queued(lock_client, lock_prefix) == 1
    assert claims(lock_client) == [sent.id]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("retries", [1, 0])
def test_a_debounce_take_over_whose_reply_was_lost_leaves_one_claim_with_a_message(
    lock_client: LockClient,
    proxy: HoldingProxy,
    enqueued: Callable[..., Any],
    lock_prefix: str,
    retries: int,
) -> None:
    """A new ``debounce`` call takes the queued call's claim over, and that reply is lost:
    sent again, the new call holds the claim and is sent; raised, the queued call's claim
    is put back, and its message is still there to run under it."""
    job = enqueued(proxied_client(lock_client, proxy, retries=retries), "debounce")
    first = job.apply_async((5,))
    proxy.hold_next_script_reply(after=1)  # the take-over, after the claim found held
    if retries:
        second = job.apply_async((5,))
        assert claims(lock_client) == [second.id]
        assert queued(lock_client, lock_prefix) == 2  # the first is skipped when it runs
    else:
        with pytest.raises(LockBackendError):
            job.apply_async((5,))
        assert claims(lock_client) == [first.id]
        assert queued(lock_client, lock_prefix) == 1
    assert proxy.holding.is_set()
