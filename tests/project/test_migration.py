"""docs/migration.md runs: each before (celery-once, celery-singleton) and after block is
declared on a real Celery app on the test Redis, and the two behave alike where the page says
so — a duplicate ``delay()`` is deduplicated (or raises) while the first call is queued, and
the key is free again once that call ran on a real worker. The redis-py ``Lock`` blocks run
on the same Redis, and the table of differences is checked where it makes a claim."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery_once import AlreadyQueued
from celery_singleton.exceptions import DuplicateTaskError

from celery_singleton_lock import DuplicateTask, LockClient, LockError, LockTimeout

WorkerFactory = Callable[..., AbstractContextManager[Any]]

PAGE = Path(__file__).resolve().parent.parent.parent / "docs" / "migration.md"
BLOCK = re.compile(r"<!-- migration: ([\w-]+) -->\n```python\n(.*?)```", re.S)


def page_blocks() -> dict[str, str]:
    return {name: code for name, code in BLOCK.findall(PAGE.read_text())}


def declare(app: Celery, block: str, redis_url: str) -> dict[str, Any]:
    """Run the page's ``block`` as a module of its own that declares tasks on ``app``."""
    namespace: dict[str, Any] = {
        "__name__": f"migration_{uuid.uuid4().hex[:8]}",
        "app": app,
        "REDIS_URL": redis_url,
    }
    exec(compile(page_blocks()[block], f"{PAGE}:{block}", "exec"), namespace)
    app.finalize()
    return namespace


def test_the_page_has_every_block() -> None:
    assert sorted(page_blocks()) == [
        "once-after", "once-before", "redis-lock-after", "redis-lock-before",
        "singleton-after", "singleton-before",
    ]  # fmt: skip


# What a duplicate delay() of the "graceful" task gives, per block: a result of no task in
# state REJECTED (celery-once's graceful) or the first call's AsyncResult; and what the
# raising task raises.
CASES = {
    "once-before": ("rejected", AlreadyQueued),
    "once-after": ("first", DuplicateTask),
    "singleton-before": ("first", DuplicateTaskError),
    "singleton-after": ("first", DuplicateTask),
}


@pytest.mark.parametrize("block", sorted(CASES))
def test_a_duplicate_call_is_deduplicated_until_the_first_ran(
    block: str,
    celery_lock_app: Celery,
    lock_redis_url: str,
    in_process_worker: WorkerFactory,
) -> None:
    duplicate_gives, raised = CASES[block]
    tasks = declare(celery_lock_app, block, lock_redis_url)
    sync_customer, bill_customer = tasks["sync_customer"], tasks["bill_customer"]

    first = sync_customer.delay(7)
    again = sync_customer.delay(7, full=True)  # another argument, outside the key
    if duplicate_gives == "rejected":
        assert again.id is None and again.state == "REJECTED"
    else:
        assert again.id == first.id
    other = sync_customer.delay(8)  # another key is sent
    assert other.id != first.id

    billed = bill_customer.delay(7, "2026-11")
    with pytest.raises(raised):
        bill_customer.delay(7, "2026-12")

    with in_process_worker(celery_lock_app, pool="threads", concurrency=2):
        assert first.get(timeout=30) == 7
        assert other.get(timeout=30) == 8
        assert billed.get(timeout=30) == 7
        # The runs returned: the keys are free for the next call. Both plugins unlock after
        # the result is stored (in after_return / on_success), so a call right after get()
        # may still meet the lock: look again until it is let through (a refused call sends
        # nothing, so looking again has no side effect).
        deadline = time.monotonic() + 30
        later = sync_customer.delay(7)
        while later.id in (None, first.id):
            assert time.monotonic() < deadline, "the key was never freed"
            time.sleep(0.05)
            later = sync_customer.delay(7)
        assert later.get(timeout=30) == 7


# What the second of two overlapping calls of the page's nightly_report raises, per block.
LOCK_CASES = {
    "redis-lock-before": redis.exceptions.LockError,
    "redis-lock-after": LockTimeout,
}


@pytest.mark.parametrize("block", sorted(LOCK_CASES))
def test_an_overlapping_call_waits_then_raises_and_the_name_is_free_after(
    block: str, lock_redis_url: str
) -> None:
    namespace: dict[str, Any] = {"REDIS_URL": lock_redis_url}
    exec(compile(page_blocks()[block], f"{PAGE}:{block}", "exec"), namespace)
    nightly_report = namespace["nightly_report"]
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        assert leave.wait(30)

    first = threading.Thread(target=nightly_report, args=(hold,))
    first.start()
    try:
        assert inside.wait(10)
        ran: list[str] = []
        with pytest.raises(LOCK_CASES[block]):
            nightly_report(lambda: ran.append("second"))
        assert ran == []
    finally:
        leave.set()
        first.join(10)
    ran = []
    nightly_report(lambda: ran.append("after"))
    assert ran == ["after"]


def test_our_lock_error_is_not_redis_pys() -> None:
    assert not issubclass(LockError, redis.exceptions.LockError)
    assert issubclass(LockTimeout, LockError)


def test_extend_sets_what_is_left_as_redis_pys_replace_ttl_does(
    lock_client: LockClient, lock_prefix: str
) -> None:
    """The table: redis-py's ``extend(t)`` adds, ``extend(t, replace_ttl=True)`` sets; ours
    sets. Both locks are extended from 20 s left to 5 s."""
    r = lock_client.redis
    theirs = r.lock(f"{lock_prefix}:theirs", timeout=20)
    assert theirs.acquire(blocking=False)
    with lock_client.lease("ours", ttl=20, heartbeat=False) as ours:
        assert ours.extend(5) == 5.0
        assert theirs.extend(5, replace_ttl=True)
        assert 4_000 < r.pttl(ours.keys.lock) <= 5_000
        assert 4_000 < r.pttl(f"{lock_prefix}:theirs") <= 5_000
        assert theirs.extend(5)  # adds
        assert r.pttl(f"{lock_prefix}:theirs") > 9_000
    theirs.release()


def test_held_is_what_this_process_knows_holders_asks_redis(lock_client: LockClient) -> None:
    lease = lock_client.lease("held", ttl=10)
    assert not lease.held and lock_client.holders("held") == []
    with lease:
        assert lease.held
        assert [h.owner for h in lock_client.holders("held")] == [lease.owner]
    assert not lease.held and lock_client.holders("held") == []
