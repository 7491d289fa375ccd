"""docs/migration.md runs: each before (celery-once, celery-singleton) and after block is
declared on a real Celery app on the test Redis, and the two behave alike where the page says
so — a duplicate ``delay()`` is deduplicated (or raises) while the first call is queued, and
the key is free again once that call ran on a real worker."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery_once import AlreadyQueued
from celery_singleton.exceptions import DuplicateTaskError

from celery_singleton_lock import DuplicateTask

WorkerFactory = Callable[..., AbstractContextManager[Any]]

PAGE = Path(__file__).resolve().parent.parent / "docs" / "migration.md"
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
        "once-after", "once-before", "singleton-after", "singleton-before",
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
