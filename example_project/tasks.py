"""Three jobs people lock in real projects."""

from __future__ import annotations

import time

from celery.utils.log import get_task_logger

from celery_singleton_lock import SingletonTask

from .celery_app import app

log = get_task_logger(__name__)


@app.task(base=SingletonTask, bind=True, lock_key="sales-report", lock_ttl=3600)
def sales_report(self: SingletonTask) -> str:
    """A periodic report that takes longer than its period: beat fires it every 4 s, a run
    takes 9 s, so the runs in between are skipped instead of piling up."""
    token = self.lock.token
    log.info("report run started (fencing token %s)", token)
    for _ in range(9):
        time.sleep(1)  # one chunk of the report's work
        self.lock.check()  # stop early if the lock was lost (a long pause, an admin clear)
    log.info("report written with fencing token %s", token)
    return f"report {token}"


@app.task(base=SingletonTask, lock_key=["customer_id"])
def sync_customer(customer_id: int, full: bool = False) -> str:
    """Per-customer work: one sync per customer at a time, customers in parallel."""
    log.info("syncing customer %s (full=%s)", customer_id, full)
    time.sleep(4)
    return f"customer {customer_id} synced"


@app.task(base=SingletonTask, lock_key="import:{source}", lock_release_delay=8)
def import_feed(source: str) -> str:
    """An import that must not run again within 8 s of the last one (release delay)."""
    log.info("importing %s", source)
    time.sleep(1)
    return f"{source} imported"
